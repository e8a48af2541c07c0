#pragma once
// Links over TCP sockets, for ranks on different hosts (or any ranks, when forced). The
// connection is made and authenticated in Python (pycollective/transports.py: HMAC
// challenge-response with the cluster token); this side takes over the connected socket and
// moves frames over it without blocking: the caller's wait loop polls the socket.
#include <memory>
#include <string>

#include "transport/link.h"

namespace pycollective {

struct TcpLinkOptions {
  int fd = -1;                    // a connected, authenticated stream socket; the link owns it
  int rank = 0, peer = 0;         // global ranks, for messages
  std::string peerAddress;        // "host:port", for messages
  size_t stagingBytes = 1 << 20;  // receive buffer for reducing receives
};

std::unique_ptr<Link> makeTcpLink(const TcpLinkOptions& options);

}  // namespace pycollective
