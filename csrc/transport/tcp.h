#pragma once
// Links over TCP sockets, for ranks on different hosts (or any ranks, when forced). The
// connection is made and authenticated in Python (pycollective/transports.py: HMAC
// challenge-response with the cluster token); this side takes over the connected socket and
// moves frames over it without blocking: the caller's wait loop polls the socket. With a key,
// the byte stream is cut into AES-256-GCM records (transport/aead.h): length (4 bytes, big
// endian, authenticated), ciphertext, 16-byte tag; the nonce is the direction and a counter
// that both ends keep, so a replayed, reordered, dropped or altered record fails its tag.
#include <memory>
#include <string>

#include "transport/link.h"

namespace pycollective {

struct TcpLinkOptions {
  int fd = -1;                    // a connected, authenticated stream socket; the link owns it
  int rank = 0, peer = 0;         // global ranks, for messages
  std::string peerAddress;        // "host:port", for messages
  size_t stagingBytes = 1 << 20;  // receive buffer for reducing receives
  // 32 bytes: every byte in both directions travels in AES-256-GCM records under this key
  // (PYCOLLECTIVE_DATA_ENCRYPT; the handshake derives it). Empty: plaintext.
  std::string key;
};

// Largest plaintext of one encrypted record: the receiver holds a whole record before it may
// release any of it (an unauthenticated byte is never used).
constexpr size_t kTcpRecordBytes = 64 << 10;

std::unique_ptr<Link> makeTcpLink(const TcpLinkOptions& options);

}  // namespace pycollective
