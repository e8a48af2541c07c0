#pragma once
// The exception hierarchy of the native core. Bindings translate each type into the Python class
// of the same role (pycollective/errors.py); nothing below the bindings returns error codes.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace pycollective {

// Base of every failure that happened while a collective ran or a link was used.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad argument, found before any data moved (-> ValueError).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// An unsupported type for the requested operation (-> TypeError).
class InvalidType : public Error {
 public:
  using Error::Error;
};

// The collective did not finish before its deadline.
class CollectiveTimeout : public Error {
 public:
  using Error::Error;
};

// A peer closed its link, died, or reported a failure of its own.
class RemoteError : public Error {
 public:
  using Error::Error;
};

// Two ranks called different collectives (or the same one with different arguments).
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// The communicator was aborted (by the user, by another thread, or by a failure elsewhere).
class Aborted : public Error {
 public:
  using Error::Error;
};

// A bug in pycollective itself: an invariant did not hold.
class InternalError : public Error {
 public:
  using Error::Error;
};

// A CUDA runtime call failed (code name and cudaGetErrorString in the message), or CUDA was
// asked for in a build or on a machine that has none.
class CudaError : public Error {
 public:
  using Error::Error;
};

// An NCCL call failed: the message carries the code name, ncclGetErrorString and, when the
// library has it, ncclGetLastError.
class NcclError : public Error {
 public:
  using Error::Error;
};

// NCCL could not be loaded (library or symbol missing, version too old): the message lists
// every path tried with the loader's error text.
class NcclUnavailable : public Error {
 public:
  using Error::Error;
};

namespace detail {
inline void appendAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void appendAll(std::ostringstream& os, T&& first, Rest&&... rest) {
  os << std::forward<T>(first);
  appendAll(os, std::forward<Rest>(rest)...);
}
}  // namespace detail

// Concatenates its arguments with operator<<: makeMessage("rank ", r, " of ", n).
template <typename... Args>
std::string makeMessage(Args&&... args) {
  std::ostringstream os;
  detail::appendAll(os, std::forward<Args>(args)...);
  return os.str();
}

}  // namespace pycollective

// Argument check: throws InvalidArgument with the message when cond is false.
#define PC_CHECK(cond, ...)                                                                       \
  do {                                                                                            \
    if (!(cond)) throw ::pycollective::InvalidArgument(::pycollective::makeMessage(__VA_ARGS__)); \
  } while (0)

// Invariant check: a failure is a pycollective bug, reported with file:line.
#define PC_ASSERT(cond, ...)                                                                \
  do {                                                                                      \
    if (!(cond))                                                                            \
      throw ::pycollective::InternalError(::pycollective::makeMessage(                      \
          "internal error at ", __FILE__, ":", __LINE__, ": ", #cond, " ", ##__VA_ARGS__)); \
  } while (0)
