// Standalone test of the shared-memory transport (csrc/transport/shm.cc): every case forks two
// processes that connect one shm link and drive it with a small waitAll-like loop; the parent
// reaps them under a hard timeout and checks that no /dev/shm entry is left behind. Built and run
// by tests/native/build_and_run.sh.
//
//   test_shm            every check, then 64 MiB one-way GB/s and 4 KiB round-trip latency
//   test_shm --bench    the two measurements only, with more repetitions
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/deadline.h"
#include "core/error.h"
#include "core/wait_policy.h"
#include "expect.h"
#include "forked.h"
#include "reduce/reduce.h"
#include "transport/frame.h"
#include "transport/shm.h"

using namespace pycollective;

namespace {

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

const std::string kDigest(32, 'k');
int gCaseCounter = 0;

std::string segmentName(const char* label) {
  return "/pycol-test-" + std::to_string(getpid()) + "-" + std::to_string(++gCaseCounter) + "-" +
         label;
}

bool shmEntryExists(const std::string& name) {
  return access(("/dev/shm" + name).c_str(), F_OK) == 0;
}

ShmLinkOptions options(const std::string& name, int side, size_t ringBytes = size_t(4) << 20) {
  ShmLinkOptions o;
  o.name = name;
  o.create = side == 0;
  o.rank = side;
  o.peer = 1 - side;
  o.authDigest = kDigest;
  o.ringBytes = ringBytes;
  o.connectTimeoutSeconds = 10;
  return o;
}

FrameHeader header(uint64_t seq, uint32_t step, size_t bytes, uint64_t count = 0) {
  FrameHeader h;
  h.seq = seq;
  h.step = step;
  h.bytes = bytes;
  h.count = count ? count : bytes;
  h.kind = static_cast<uint8_t>(CollectiveKind::kAllreduce);
  h.dtype = static_cast<uint8_t>(DType::kFloat32);
  h.op = static_cast<uint8_t>(ReduceOp::kSum);
  return h;
}

// The test's waitAll: polls progress() until every request completed or the deadline passed.
// Like Communicator::waitAll it spins, then yields, so that a busy machine with fewer cores than
// runnable processes still lets the peer run.
void waitAll(Link& link, const std::vector<RequestPtr>& requests, double seconds = 60) {
  Deadline deadline = Deadline::after(seconds);
  int idle = 0;
  for (;;) {
    bool moved = link.progress();
    bool done = std::all_of(requests.begin(), requests.end(), [](const RequestPtr& r) {
      return r->done.load(std::memory_order_acquire);
    });
    if (done) return;
    if (moved) {
      idle = 0;
      continue;
    }
    if (deadline.expired())
      throw CollectiveTimeout("test wait timed out after " + std::to_string(seconds) + " s on " +
                              link.describe());
    if (++idle < 64)
      cpuRelax();
    else
      std::this_thread::yield();
  }
}

void waitOne(Link& link, const RequestPtr& r, double seconds = 60) {
  waitAll(link, {r}, seconds);
}

// Runs the two sides of a case in two processes, then checks both passed and that the segment
// left no /dev/shm entry.
void runPair(const char* label, const std::function<int(const std::string&)>& side0,
             const std::function<int(const std::string&)>& side1, double seconds = 120) {
  const std::string name = segmentName(label);
  auto t0 = Clock::now();
  pid_t a = spawn([&] { return side0(name); });
  pid_t b = spawn([&] { return side1(name); });
  auto st = reap({a, b}, seconds);
  ++gChecks;
  if (!exitedOk(st[0]) || !exitedOk(st[1])) {
    ++gFailures;
    std::fprintf(stderr, "FAIL case %s: side 0 status 0x%x, side 1 status 0x%x\n", label, st[0],
                 st[1]);
  }
  EXPECT(!shmEntryExists(name), "case %s left /dev/shm%s", label, name.c_str());
  std::printf("  case %-26s %s (%.2f s)\n", label,
              exitedOk(st[0]) && exitedOk(st[1]) ? "ok" : "FAILED", secondsSince(t0));
  std::fflush(stdout);
}

// Deterministic payload bytes of message k, without a short period: a piece copied from the
// wrong offset (one lap of the ring off, say) cannot look right.
uint8_t patternByte(size_t k, size_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (k + 1) * 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>((x ^ (x >> 29)) >> 24);
}

void fillPattern(std::vector<uint8_t>& v, size_t k) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = patternByte(k, i);
}

size_t firstPatternMismatch(const std::vector<uint8_t>& v, size_t k) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != patternByte(k, i)) return i;
  return SIZE_MAX;
}

float sendValue(size_t k, size_t i) {
  return static_cast<float>(i % 1000) * 0.5f + k;
}
float accumValue(size_t i) {
  return static_cast<float>(i % 7) - 3.0f;
}

const size_t kCopySizes[] = {0, 1, 7, 4096, size_t(1) << 20, (size_t(64) << 20) + 8};
const size_t kReduceElems[] = {0, 1, 7, 1024, size_t(1) << 18, (size_t(16) << 20) + 2};

// Sender side of the "messages" exchange: the copy sizes one at a time, many random small
// messages posted at once, and the float32 payloads for the receiver to reduce.
void sendMessages(Link& link, uint64_t seqBase) {
  uint64_t seq = seqBase;
  for (size_t k = 0; k < sizeof(kCopySizes) / sizeof(kCopySizes[0]); ++k) {
    std::vector<uint8_t> data(kCopySizes[k]);
    fillPattern(data, k);
    waitOne(link, link.postSend(data.data(), data.size(), header(seq++, 0, data.size())));
  }
  // Many messages in flight at once: they wrap the ring at every offset and complete in order.
  std::mt19937 rng(1234);
  std::vector<std::vector<uint8_t>> many(600);
  std::vector<RequestPtr> reqs;
  for (size_t k = 0; k < many.size(); ++k) {
    many[k].resize(rng() % 3 == 0 ? rng() % 40000 : rng() % 64);
    fillPattern(many[k], k + 100);
    reqs.push_back(link.postSend(many[k].data(), many[k].size(),
                                 header(seq, static_cast<uint32_t>(k), many[k].size())));
  }
  ++seq;
  waitAll(link, reqs);
  for (size_t k = 0; k < sizeof(kReduceElems) / sizeof(kReduceElems[0]); ++k) {
    const size_t n = kReduceElems[k];
    std::vector<float> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = sendValue(k, i);
    waitOne(link, link.postSend(data.data(), n * 4, header(seq++, 0, n * 4, n)));
  }
}

void recvMessages(Link& link, uint64_t seqBase) {
  uint64_t seq = seqBase;
  for (size_t k = 0; k < sizeof(kCopySizes) / sizeof(kCopySizes[0]); ++k) {
    std::vector<uint8_t> data(kCopySizes[k], 0xEE);
    RecvSpec spec;
    spec.dst = data.data();
    spec.bytes = data.size();
    waitOne(link, link.postRecv(spec, header(seq++, 0, data.size())));
    size_t bad = firstPatternMismatch(data, k);
    EXPECT(bad == SIZE_MAX, "copy of %zu bytes differs at byte %zu", data.size(), bad);
  }
  std::mt19937 rng(1234);
  std::vector<std::vector<uint8_t>> many(600);
  std::vector<RequestPtr> reqs;
  for (size_t k = 0; k < many.size(); ++k) {
    many[k].assign(rng() % 3 == 0 ? rng() % 40000 : rng() % 64, 0xEE);
    RecvSpec spec;
    spec.dst = many[k].data();
    spec.bytes = many[k].size();
    reqs.push_back(link.postRecv(spec, header(seq, static_cast<uint32_t>(k), many[k].size())));
  }
  ++seq;
  waitAll(link, reqs);
  size_t badMessages = 0;
  for (size_t k = 0; k < many.size(); ++k)
    badMessages += firstPatternMismatch(many[k], k + 100) != SIZE_MAX;
  EXPECT(badMessages == 0, "%zu of %zu small messages differ", badMessages, many.size());

  const ReduceFn sum = lookupReduce(DType::kFloat32, ReduceOp::kSum);
  for (size_t k = 0; k < sizeof(kReduceElems) / sizeof(kReduceElems[0]); ++k) {
    const size_t n = kReduceElems[k];
    // Odd k: dst = dst + incoming (accum nullptr); even k: dst = accum + incoming.
    std::vector<float> dst(n), accum(n);
    for (size_t i = 0; i < n; ++i) {
      accum[i] = accumValue(i);
      dst[i] = k % 2 ? accum[i] : -1e30f;
    }
    RecvSpec spec;
    spec.dst = dst.data();
    spec.bytes = n * 4;
    spec.reduce = sum;
    spec.accum = k % 2 ? nullptr : accum.data();
    spec.elemSize = 4;
    waitOne(link, link.postRecv(spec, header(seq++, 0, n * 4, n)));
    size_t bad = SIZE_MAX;
    for (size_t i = 0; i < n && bad == SIZE_MAX; ++i)
      if (dst[i] != accumValue(i) + sendValue(k, i)) bad = i;
    EXPECT(bad == SIZE_MAX, "reduce of %zu floats (accum %s) differs at %zu", n,
           k % 2 ? "dst" : "separate", bad);
  }
}

// Both directions at once: each side posts a large send and a large receive and drives both
// with one loop, which only works if progress() never waits on one of them.
void exchangeBoth(Link& link, int side) {
  const size_t bytes = (size_t(24) << 20) + 24;
  std::vector<uint8_t> out(bytes), in(bytes, 0);
  fillPattern(out, 500 + side);
  RecvSpec spec;
  spec.dst = in.data();
  spec.bytes = bytes;
  auto r = link.postRecv(spec, header(900, 0, bytes));
  auto s = link.postSend(out.data(), bytes, header(900, 0, bytes));
  waitAll(link, {r, s});
  size_t bad = firstPatternMismatch(in, 500 + (1 - side));
  EXPECT(bad == SIZE_MAX, "full-duplex exchange differs at %zu", bad);
}

int messagesSide(const std::string& name, int side, size_t ringBytes) {
  auto link = connectShm(options(name, side, ringBytes));
  EXPECT(!shmEntryExists(name), "/dev/shm%s still exists after the handshake", name.c_str());
  std::string d = link->describe();
  EXPECT(d == "shm " + name + " -> rank " + std::to_string(1 - side), "describe: %s", d.c_str());
  EXPECT(link->notifier() == nullptr && !link->sharesMemory(), "notifier/sharesMemory");
  // 0 -> 1, then 1 -> 0, then both at once.
  if (side == 0)
    sendMessages(*link, 0);
  else
    recvMessages(*link, 0);
  if (side == 1)
    sendMessages(*link, 100);
  else
    recvMessages(*link, 100);
  exchangeBoth(*link, side);
  return gFailures ? 1 : 0;
}

void testMessages(size_t ringBytes, const char* label) {
  runPair(
      label, [&](const std::string& n) { return messagesSide(n, 0, ringBytes); },
      [&](const std::string& n) { return messagesSide(n, 1, ringBytes); });
}

// A header mismatch: ProtocolError on the receiver naming both calls and both ranks, and a
// RemoteError with the receiver's message on the sender (here still sending: 8 MiB > ring).
void testMismatch() {
  runPair(
      "header mismatch",
      [](const std::string& name) {
        auto link = connectShm(options(name, 0));
        std::vector<uint8_t> data(size_t(8) << 20, 1);
        std::string what;
        try {
          waitOne(*link, link->postSend(data.data(), data.size(), header(5, 0, data.size())));
        } catch (const RemoteError& e) {
          what = e.what();
        }
        EXPECT(what.rfind("rank 1 aborted: rank 1 expected allreduce#6", 0) == 0 &&
                   what.find("rank 0 sent allreduce#5") != std::string::npos,
               "sender got '%s'", what.c_str());
        return gFailures ? 1 : 0;
      },
      [](const std::string& name) {
        auto link = connectShm(options(name, 1));
        std::vector<uint8_t> data(size_t(8) << 20);
        RecvSpec spec;
        spec.dst = data.data();
        spec.bytes = data.size();
        std::string what;
        try {
          waitOne(*link, link->postRecv(spec, header(6, 0, data.size())));
        } catch (const ProtocolError& e) {
          what = e.what();
        }
        EXPECT(what.find("rank 1 expected allreduce#6 (ring, float32") == 0 &&
                   what.find("but rank 0 sent allreduce#5") != std::string::npos &&
                   what.find("sequence number: here 6, peer 5") != std::string::npos,
               "receiver got '%s'", what.c_str());
        return gFailures ? 1 : 0;
      });

  // A size mismatch within the same call is caught too (the receiver expects other bytes).
  runPair(
      "size mismatch",
      [](const std::string& name) {
        auto link = connectShm(options(name, 0));
        std::vector<uint8_t> data(100);
        waitOne(*link, link->postSend(data.data(), 100, header(1, 0, 100, 1000)));
        std::string what;
        try {
          RecvSpec spec;
          waitOne(*link, link->postRecv(spec, header(2, 0, 0)));
        } catch (const RemoteError& e) {
          what = e.what();
        }
        EXPECT(what.find("rank 1 aborted:") == 0, "sender got '%s'", what.c_str());
        return gFailures ? 1 : 0;
      },
      [](const std::string& name) {
        auto link = connectShm(options(name, 1));
        std::vector<uint8_t> data(96);
        RecvSpec spec;
        spec.dst = data.data();
        spec.bytes = 96;
        std::string what;
        try {
          waitOne(*link, link->postRecv(spec, header(1, 0, 96, 1000)));
        } catch (const ProtocolError& e) {
          what = e.what();
        }
        EXPECT(what.find("step/size differ") != std::string::npos, "receiver got '%s'",
               what.c_str());
        return gFailures ? 1 : 0;
      });
}

// abort(reason) reaches a peer that waits, with the reason (truncated when long).
void testAbort() {
  const std::string reason = "the test said so " + std::string(3000, 'x');
  runPair(
      "abort reaches peer",
      [&](const std::string& name) {
        auto link = connectShm(options(name, 0));
        uint8_t byte = 0;
        RecvSpec spec;
        spec.dst = &byte;
        spec.bytes = 1;
        waitOne(*link, link->postRecv(spec, header(1, 0, 1)));
        link->abort(reason);
        link->abort("a second abort keeps the first reason");
        std::string what;
        try {
          link->postSend(&byte, 1, header(2, 0, 1));
        } catch (const RemoteError& e) {
          what = e.what();
        }
        EXPECT(what.find("rank 0 aborted: the test said so") == 0, "own postSend after abort: '%s'",
               what.c_str());
        return gFailures ? 1 : 0;
      },
      [&](const std::string& name) {
        auto link = connectShm(options(name, 1));
        uint8_t byte = 7;
        waitOne(*link, link->postSend(&byte, 1, header(1, 0, 1)));
        RecvSpec spec;
        spec.dst = &byte;
        spec.bytes = 1;
        std::string what;
        auto t0 = Clock::now();
        try {
          waitOne(*link, link->postRecv(spec, header(2, 0, 1)), 10);
        } catch (const RemoteError& e) {
          what = e.what();
        }
        EXPECT(what.find("rank 0 aborted: the test said so xxx") == 0 && what.size() < 1100 &&
                   what.substr(what.size() - 3) == "...",
               "peer got '%.80s...' (%zu chars)", what.c_str(), what.size());
        EXPECT(secondsSince(t0) < 5, "abort took %.2f s to arrive", secondsSince(t0));
        return gFailures ? 1 : 0;
      });
}

// A peer that closes normally: what it sent is still delivered, then a receive fails.
void testClosed() {
  runPair(
      "peer closes its link",
      [](const std::string& name) {
        auto link = connectShm(options(name, 0));
        std::vector<uint8_t> data(5000);
        fillPattern(data, 77);
        waitOne(*link, link->postSend(data.data(), data.size(), header(1, 0, data.size())));
        link.reset();  // closes: the message is in the ring, the peer has not read it yet
        return 0;
      },
      [](const std::string& name) {
        auto link = connectShm(options(name, 1));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the peer close
        std::vector<uint8_t> data(5000);
        RecvSpec spec;
        spec.dst = data.data();
        spec.bytes = data.size();
        waitOne(*link, link->postRecv(spec, header(1, 0, data.size())), 10);
        EXPECT(firstPatternMismatch(data, 77) == SIZE_MAX, "message sent before close differs");
        std::string what;
        try {
          waitOne(*link, link->postRecv(spec, header(2, 0, data.size())), 10);
        } catch (const RemoteError& e) {
          what = e.what();
        }
        EXPECT(what.find("rank 0 closed its link") == 0, "got '%s'", what.c_str());
        what.clear();
        try {
          link->postSend(data.data(), 10, header(3, 0, 10));
        } catch (const RemoteError& e) {
          what = e.what();
        }
        EXPECT(what.find("rank 0 closed its link") == 0, "postSend after close: '%s'",
               what.c_str());
        return gFailures ? 1 : 0;
      });
}

// The waiting side of a kill -9: must fail within 1 s of the peer's death.
int waitForVictim(Link& link, const char* how) {
  uint8_t byte = 0;
  RecvSpec spec;
  spec.dst = &byte;
  spec.bytes = 1;
  waitOne(link, link.postRecv(spec, header(1, 0, 1)), 20);
  auto t0 = Clock::now();  // the victim kills itself right after this message
  std::string what;
  try {
    waitOne(link, link.postRecv(spec, header(2, 0, 1)), 20);
  } catch (const RemoteError& e) {
    what = e.what();
  }
  double s = secondsSince(t0);
  EXPECT(what.find("rank 1 (pid ") == 0 &&
             what.find(") died while this rank waited for it over shm") != std::string::npos,
         "got '%s'", what.c_str());
  EXPECT(s < 1.0, "death noticed after %.3f s", s);
  std::printf("    kill -9 of the peer (%s) noticed after %.0f ms\n", how, s * 1e3);
  return gFailures ? 1 : 0;
}

void victim(const std::string& name) {
  auto link = connectShm(options(name, 1));
  uint8_t byte = 1;
  waitOne(*link, link->postSend(&byte, 1, header(1, 0, 1)));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  raise(SIGKILL);
}

void testKill() {
  // The victim is the test's child: reaped at once, so its pid disappears (ESRCH).
  const std::string name = segmentName("kill");
  auto t0 = Clock::now();
  pid_t a = spawn([&] {
    auto link = connectShm(options(name, 0));
    return waitForVictim(*link, "reaped");
  });
  pid_t b = spawn([&] {
    victim(name);
    return 5;
  });
  auto st = reap({a, b});
  EXPECT(exitedOk(st[0]), "waiting side status 0x%x", st[0]);
  EXPECT(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL, "victim status 0x%x", st[1]);
  EXPECT(!shmEntryExists(name), "left /dev/shm%s", name.c_str());
  std::printf("  case %-26s %s (%.2f s)\n", "kill -9 (reaped)", exitedOk(st[0]) ? "ok" : "FAILED",
              secondsSince(t0));

  // The victim is the waiter's own child, unreaped while it waits: a zombie, whose pid still
  // answers kill(pid, 0).
  const std::string name2 = segmentName("kill-zombie");
  t0 = Clock::now();
  pid_t c = spawn([&] {
    pid_t v = spawn([&] {
      victim(name2);
      return 5;
    });
    auto link = connectShm(options(name2, 0));
    int rc = waitForVictim(*link, "zombie");
    int vs = 0;
    waitpid(v, &vs, 0);
    return rc;
  });
  st = reap({c});
  EXPECT(exitedOk(st[0]), "waiting side status 0x%x", st[0]);
  EXPECT(!shmEntryExists(name2), "left /dev/shm%s", name2.c_str());
  std::printf("  case %-26s %s (%.2f s)\n", "kill -9 (zombie)", exitedOk(st[0]) ? "ok" : "FAILED",
              secondsSince(t0));
}

// An opener with another digest refuses the segment; the creator learns it at once.
void testWrongDigest() {
  runPair(
      "wrong auth digest",
      [](const std::string& name) {
        std::string what;
        auto t0 = Clock::now();
        try {
          connectShm(options(name, 0));
        } catch (const RemoteError& e) {
          what = e.what();
        }
        EXPECT(what.find("rank 1 refused shm segment") == 0 &&
                   what.find("authentication digest") != std::string::npos,
               "creator got '%s'", what.c_str());
        EXPECT(secondsSince(t0) < 5, "refusal took %.2f s", secondsSince(t0));
        return gFailures ? 1 : 0;
      },
      [](const std::string& name) {
        ShmLinkOptions o = options(name, 1);
        o.authDigest[31] ^= 1;
        std::string what;
        try {
          connectShm(o);
        } catch (const Error& e) {
          what = e.what();
        }
        EXPECT(what.find("rank 1 refused shm segment") == 0 &&
                   what.find("authentication digest differs") != std::string::npos,
               "opener got '%s'", what.c_str());
        return gFailures ? 1 : 0;
      });
}

// Nobody comes: each side times out cleanly, on time, leaving nothing in /dev/shm.
void testTimeouts() {
  runPair(
      "opener never comes",
      [](const std::string& name) {
        ShmLinkOptions o = options(name, 0);
        o.connectTimeoutSeconds = 0.5;
        std::string what;
        auto t0 = Clock::now();
        try {
          connectShm(o);
        } catch (const CollectiveTimeout& e) {
          what = e.what();
        }
        double s = secondsSince(t0);
        EXPECT(what.find("rank 0 timed out after 0.5 s waiting for rank 1 to attach") == 0,
               "got '%s'", what.c_str());
        EXPECT(s >= 0.45 && s < 1.5, "timed out after %.2f s", s);
        EXPECT(!shmEntryExists(name), "the creator left /dev/shm%s", name.c_str());
        return gFailures ? 1 : 0;
      },
      [](const std::string&) { return 0; });
  runPair(
      "creator never comes", [](const std::string&) { return 0; },
      [](const std::string& name) {
        ShmLinkOptions o = options(name, 1);
        o.connectTimeoutSeconds = 0.3;
        std::string what;
        try {
          connectShm(o);
        } catch (const CollectiveTimeout& e) {
          what = e.what();
        }
        EXPECT(what.find("rank 1 timed out after 0.3 s waiting for rank 0 to create") == 0,
               "got '%s'", what.c_str());
        return gFailures ? 1 : 0;
      });
  // The creator gives up just before the opener arrives: the opener must not hang either.
  runPair(
      "opener comes too late",
      [](const std::string& name) {
        ShmLinkOptions o = options(name, 0);
        o.connectTimeoutSeconds = 0.2;
        try {
          connectShm(o);
          EXPECT(false, "connect succeeded");
        } catch (const CollectiveTimeout&) {
        }
        return gFailures ? 1 : 0;
      },
      [](const std::string& name) {
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
        ShmLinkOptions o = options(name, 1);
        o.connectTimeoutSeconds = 0.3;
        try {
          connectShm(o);
          EXPECT(false, "connect succeeded");
        } catch (const Error&) {
        }
        return gFailures ? 1 : 0;
      });
}

void testBadOptions() {
  auto rejects = [](ShmLinkOptions o, const char* what) {
    bool threw = false;
    try {
      connectShm(o);
    } catch (const InvalidArgument&) {
      threw = true;
    }
    EXPECT(threw, "%s was accepted", what);
  };
  const std::string name = segmentName("bad");
  ShmLinkOptions o = options(name, 0);
  o.ringBytes = 4096 + 8;
  rejects(o, "a ring size not a multiple of 64");
  o = options(name, 0);
  o.ringBytes = 1024;
  rejects(o, "a tiny ring");
  o = options(name, 0);
  o.authDigest = "short";
  rejects(o, "a short digest");
  o = options("no-slash", 0);
  rejects(o, "a name without '/'");
  EXPECT(!shmEntryExists(name), "bad options left /dev/shm%s", name.c_str());
}

// ---------------------------------------------------------------------------------------------
// Measurements.

double memcpyGBps(size_t bytes, int reps) {
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, secondsSince(t0));
  }
  return bytes / best / 1e9;
}

void measure(int reps, int pingPongs) {
  const size_t big = size_t(64) << 20;
  const std::string name = segmentName("bench");
  pid_t a = spawn([&] {
    auto link = connectShm(options(name, 0));
    std::vector<uint8_t> data(big, 3);
    for (int r = 0; r < reps + 1; ++r)  // +1: warm-up
      waitOne(*link, link->postSend(data.data(), big, header(r, 0, big)));
    std::vector<uint8_t> small(4096, 5);
    RecvSpec spec;
    spec.dst = small.data();
    spec.bytes = small.size();
    for (int i = 0; i < pingPongs + 1000; ++i) {
      waitOne(*link, link->postRecv(spec, header(i, 1, 4096)));
      waitOne(*link, link->postSend(small.data(), 4096, header(i, 2, 4096)));
    }
    return 0;
  });
  pid_t b = spawn([&] {
    auto link = connectShm(options(name, 1));
    std::vector<uint8_t> data(big, 0);
    RecvSpec spec;
    spec.dst = data.data();
    spec.bytes = big;
    waitOne(*link, link->postRecv(spec, header(0, 0, big)));
    auto t0 = Clock::now();
    for (int r = 1; r < reps + 1; ++r) waitOne(*link, link->postRecv(spec, header(r, 0, big)));
    double s = secondsSince(t0);
    std::vector<uint8_t> small(4096, 6);
    RecvSpec sspec;
    sspec.dst = small.data();
    sspec.bytes = small.size();
    Clock::time_point p0;
    for (int i = 0; i < pingPongs + 1000; ++i) {
      if (i == 1000) p0 = Clock::now();  // after warm-up
      waitOne(*link, link->postSend(small.data(), 4096, header(i, 1, 4096)));
      waitOne(*link, link->postRecv(sspec, header(i, 2, 4096)));
    }
    double rtt = secondsSince(p0) / pingPongs;
    std::printf(
        "  shm 64 MiB one-way: %.2f GB/s (%d messages, 4 MiB ring; memcpy of 64 MiB in "
        "one process: %.2f GB/s)\n",
        double(big) * reps / s / 1e9, reps, memcpyGBps(big, 5));
    std::printf("  shm 4 KiB ping-pong: %.2f us round trip (%d round trips, both sides polling)\n",
                rtt * 1e6, pingPongs);
    return 0;
  });
  auto st = reap({a, b});
  EXPECT(exitedOk(st[0]) && exitedOk(st[1]), "bench statuses 0x%x 0x%x", st[0], st[1]);
  EXPECT(!shmEntryExists(name), "bench left /dev/shm%s", name.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  // No algorithm is linked here: name index 0 the way the registry would, through the namer
  // the transport offers to the layers above it.
  registerAlgorithmNamer([](uint8_t index) { return index == 0 ? "ring" : "test-algo"; });
  const std::string mode = argc > 1 ? argv[1] : "";
  if (!mode.empty() && mode != "--bench") {
    std::fprintf(stderr, "usage: %s [--bench]\n", argv[0]);
    return 2;
  }
  alarm(900);  // nothing here may hang: a deadlock kills the test instead
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const auto t0 = Clock::now();
  if (mode == "--bench") {
    measure(20, 100000);
  } else {
    std::printf("shm transport, %u CPUs\n", std::thread::hardware_concurrency());
    testBadOptions();
    testMessages(size_t(4) << 20, "messages, 4 MiB ring");
    testMessages(4096 + 64, "messages, 4160 B ring");
    testMismatch();
    testAbort();
    testClosed();
    testKill();
    testWrongDigest();
    testTimeouts();
    measure(5, 20000);
  }
  std::printf("%s: %d checks, %d failures (%.1f s)\n", gFailures ? "FAILED" : "PASSED", gChecks,
              gFailures, secondsSince(t0));
  return gFailures ? 1 : 0;
}
