#pragma once
// Links between processes of one host over POSIX shared memory. Each pair of ranks shares one
// segment holding two single-producer/single-consumer byte rings, one per direction. A message
// is copied once into the ring by the sender and once out of it (or reduced straight out of it)
// by the receiver; no syscall is made while data moves, so a small message costs microseconds.
//
// A peer that aborts leaves its reason in the segment, so the other side fails with it; a peer
// that dies without saying so (kill -9) is noticed by checking its pid while waiting for it.
#include <cstddef>
#include <memory>
#include <string>

#include "transport/link.h"

namespace pycollective {

struct ShmLinkOptions {
  // POSIX shm name, e.g. "/pycol-<session>-<lo>-<hi>": chosen by the caller, unique per pair
  // and group, so that no two segments ever meet under one name.
  std::string name;
  // True on the lower rank of the pair: it creates the segment (O_CREAT|O_EXCL, mode 0600) and
  // initializes it; the other side opens it.
  bool create = false;
  int rank = -1;  // global rank of this side, for messages
  int peer = -1;  // global rank of the other side
  // 32 bytes computed by the caller from the cluster token. The creator stores it; the opener
  // compares it in constant time and refuses a segment whose digest differs, so ranks of another
  // cluster (or a stale segment of another session) are never mixed with this one.
  std::string authDigest;
  // Capacity of each direction's ring in bytes: a multiple of 64, at least 4096. The opener uses
  // the creator's value.
  size_t ringBytes = size_t(4) << 20;
  // The opener retries shm_open until then (the creator may not be there yet); the creator waits
  // until then for the opener to attach.
  double connectTimeoutSeconds = 30.0;
};

// Blocks until both sides attached, or throws: CollectiveTimeout when the other side did not
// come in time, InvalidArgument for bad options, Error when the segment cannot be created or was
// refused. On every failure of the creator the name is unlinked; the opener unlinks it as soon as
// it mapped it, so no /dev/shm entry outlives the handshake.
std::unique_ptr<Link> connectShm(const ShmLinkOptions& options);

}  // namespace pycollective
