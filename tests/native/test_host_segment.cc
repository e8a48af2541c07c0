// Standalone test of the host segment (csrc/transport/host_segment.cc): every case forks one
// process per member, which connect one segment and make calls on it the way algorithms/slots.cc
// does; the parent reaps them under a hard timeout and checks that no /dev/shm entry is left.
// Under the sanitizer build (.ci/native_tests.sh) this is where the segment's memory accesses
// are checked.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/deadline.h"
#include "core/error.h"
#include "expect.h"
#include "forked.h"
#include "transport/cross_memory.h"
#include "transport/frame.h"
#include "transport/host_segment.h"

using namespace pycollective;

namespace {

int gCase = 0;

std::string segmentName(const char* label) {
  return "/pycol-test-" + std::to_string(getpid()) + "-" + std::to_string(++gCase) + "-" + label;
}

bool shmEntryExists(const std::string& name) {
  return access(("/dev/shm" + name).c_str(), F_OK) == 0;
}

HostSegmentOptions options(const std::string& name, int members, int member, size_t slot = 256) {
  HostSegmentOptions o;
  o.name = name;
  for (int m = 0; m < members; ++m) o.ranks.push_back(m);
  o.member = member;
  o.worldSize = members;
  o.authDigest = std::string(32, 'k');
  o.slotBytes = slot;
  o.connectTimeoutSeconds = 10;
  return o;
}

FrameHeader header(uint64_t seq, uint64_t count) {
  FrameHeader h;
  h.seq = seq;
  h.count = count;
  h.kind = static_cast<uint8_t>(CollectiveKind::kAllreduce);
  h.dtype = static_cast<uint8_t>(DType::kFloat32);
  return h;
}

// Member 0's side of a failure case: one call whose wait for member 1 must end in an `E` whose
// message holds `needle`. Returns the exit status.
template <typename E>
int expectWaitFails(HostSegment& seg, uint64_t count, double seconds, const char* needle) {
  const Deadline deadline = Deadline::after(seconds);
  HostSegment::Call call(seg, header(0, count), deadline);
  call.publish(0);
  try {
    call.await(1, 0);
  } catch (const E& e) {
    EXPECT(std::strstr(e.what(), needle) != nullptr, "%s", e.what());
    return gFailures ? 1 : 0;
  }
  EXPECT(false, "the wait ended without the error (%s)", needle);
  return 1;
}

// Runs body(member) in one process per member; checks every one exited 0 and the name is gone.
void runMembers(const char* label, int members,
                const std::function<int(const std::string&, int)>& body) {
  const std::string name = segmentName(label);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (int m = 0; m < members; ++m) pids.push_back(spawn([&, m] { return body(name, m); }));
  const std::vector<int> st = reap(pids, 60);
  bool ok = true;
  for (int m = 0; m < members; ++m) {
    EXPECT(exitedOk(st[m]), "%s: member %d status 0x%x", label, m, st[m]);
    ok = ok && exitedOk(st[m]);
  }
  EXPECT(!shmEntryExists(name), "%s left /dev/shm%s", label, name.c_str());
  std::printf("  case %-30s %s (%.2f s)\n", label, ok ? "ok" : "FAILED",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// Many calls back to back, alternating slots: each member publishes (call, member) pairs and
// reads everyone's; a slot rewritten too early would show another call's values.
void testCalls(int members) {
  runMembers("calls back to back", members, [members](const std::string& name, int me) {
    auto seg = HostSegment::connect(options(name, members, me));
    const Deadline deadline = Deadline::after(30);
    for (uint64_t k = 0; k < 20000; ++k) {
      const size_t words = 1 + k % 64;  // 4 to 256 bytes
      HostSegment::Call call(*seg, header(k, words), deadline);
      auto* mine = static_cast<uint32_t*>(call.payload());
      for (size_t i = 0; i < words; ++i) mine[i] = static_cast<uint32_t>(k * 131 + me * 7 + i);
      call.publish(words * 4);
      for (int m = 0; m < members; ++m) {
        if (m == me) continue;
        const auto* theirs = static_cast<const uint32_t*>(call.await(m, words * 4));
        for (size_t i = 0; i < words; ++i)
          if (theirs[i] != static_cast<uint32_t>(k * 131 + m * 7 + i)) {
            EXPECT(false, "call %llu: member %d word %zu is %u", (unsigned long long)k, m, i,
                   theirs[i]);
            return 1;
          }
      }
    }
    return gFailures ? 1 : 0;
  });
}

// While a member's waits find the others far, every member writes its payloads past the cache
// (Call::write, streaming stores): the others must read the same bytes, at every length and
// alignment of the tail, and a near window on that member takes it back.
void testStreamedPayloads() {
  constexpr int kMembers = 3;
  runMembers("streamed payloads", kMembers, [](const std::string& name, int me) {
    HostSegmentOptions o = options(name, kMembers, me, 16 << 10);
    o.timeWaits = false;  // the distance is what this test says, not what the machine does now
    auto seg = HostSegment::connect(o);
    const Deadline deadline = Deadline::after(30);
    std::vector<uint32_t> src(4096);
    auto round = [&](uint64_t first, uint64_t calls) {
      for (uint64_t k = first; k < first + calls; ++k) {
        const size_t words = 1 + (k * 37) % 4096;  // 4 bytes to 16 KiB, both sides of 2 KiB
        for (size_t i = 0; i < words; ++i) src[i] = static_cast<uint32_t>(k * 131 + me * 7 + i);
        HostSegment::Call call(*seg, header(k, words), deadline);
        call.write(src.data(), words * 4);
        call.publish(words * 4);
        for (int m = 0; m < kMembers; ++m) {
          const auto* theirs =
              static_cast<const uint32_t*>(m == me ? call.payload() : call.await(m, words * 4));
          for (size_t i = 0; i < words; ++i)
            if (theirs[i] != static_cast<uint32_t>(k * 131 + m * 7 + i)) {
              EXPECT(false, "call %llu (%s): member %d word %zu of %zu is %u",
                     (unsigned long long)k, seg->streamsPayloads() ? "streamed" : "cached", m, i,
                     words, theirs[i]);
              return false;
            }
        }
      }
      return true;
    };
    // No member votes before it finished call 7, which waits for this one's.
    EXPECT(!seg->streamsPayloads(), "member %d: streaming before any distance", me);
    if (!round(0, 8)) return 1;
    if (me == 0)
      for (int i = 0; i < PeerDistance::kWindow; ++i) seg->addDistanceSample(200);
    // Member 0 voted before it published call 8, which every member waits for.
    if (!round(8, 1)) return 1;
    EXPECT(seg->streamsPayloads(), "member %d: member 0 finds the others far, yet no streaming",
           me);
    if (!round(9, 300)) return 1;
    if (me == 0)
      for (int i = 0; i < PeerDistance::kWindow; ++i) seg->addDistanceSample(30);
    if (!round(309, 1)) return 1;
    EXPECT(!seg->streamsPayloads(), "member %d: every member near, still streaming", me);
    return round(310, 100) && gFailures == 0 ? 0 : 1;
  });
}

// A member that finds every slot already published when it waits still times its loads: its
// vote follows the machine, not a window from long ago (here one fed by the test).
void testLastArriverRetimes() {
#if defined(__x86_64__)  // elsewhere loads are not timed
  constexpr int kMembers = 2;
  runMembers("last arriver re-times", kMembers, [](const std::string& name, int me) {
    auto seg = HostSegment::connect(options(name, kMembers, me));
    const Deadline deadline = Deadline::after(30);
    constexpr double kFed = 12345;  // no real load takes exactly this long
    if (me == 1)
      for (int i = 0; i < PeerDistance::kWindow; ++i) seg->addDistanceSample(kFed);
    constexpr uint64_t kCalls = 4 * HostSegment::kTimedCallEvery * PeerDistance::kWindow;
    for (uint64_t k = 0; k < kCalls; ++k) {
      HostSegment::Call call(*seg, header(k, 1), deadline);
      call.publish(4);
      // Member 0 has long published when member 1 looks.
      if (me == 1) std::this_thread::sleep_for(std::chrono::microseconds(200));
      call.await(1 - me, 4);
    }
    if (me == 1)
      EXPECT(seg->distanceNanoseconds() != kFed,
             "member 1 arrived last in %llu calls and kept the distance it was fed",
             (unsigned long long)kCalls);
    return gFailures ? 1 : 0;
  });
#endif
}

// Member 1 calls with another count: every member fails with ProtocolError naming the counts.
void testMismatch() {
  runMembers("mismatched calls", 3, [](const std::string& name, int me) {
    auto seg = HostSegment::connect(options(name, 3, me));
    const Deadline deadline = Deadline::after(10);
    HostSegment::Call call(*seg, header(0, me == 1 ? 5 : 6), deadline);
    call.publish(0);
    try {
      for (int m = 0; m < 3; ++m)
        if (m != me) call.await(m, 0);
    } catch (const ProtocolError& e) {
      EXPECT(std::strstr(e.what(), "element count") != nullptr, "%s", e.what());
      return gFailures ? 1 : 0;
    } catch (const RemoteError& e) {  // a peer that failed first says so through its abort
      EXPECT(std::strstr(e.what(), "element count") != nullptr, "%s", e.what());
      return gFailures ? 1 : 0;
    }
    EXPECT(false, "member %d saw no mismatch", me);
    return 1;
  });
}

// A member that runs the same collective over links instead is caught by its notice.
void testLinkCall() {
  runMembers("call over links announced", 2, [](const std::string& name, int me) {
    auto seg = HostSegment::connect(options(name, 2, me));
    if (me == 1) {
      FrameHeader ring = header(0, 100000);
      ring.algo = 1;
      seg->announceLinkCall(ring);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return 0;
    }
    return expectWaitFails<ProtocolError>(*seg, 5, 10, "over links");
  });
}

// An abort, a timeout and a death each end a wait with the matching error.
void testFailures() {
  runMembers("abort reaches the waiter", 2, [](const std::string& name, int me) {
    auto seg = HostSegment::connect(options(name, 2, me));
    if (me == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      seg->abort("member 1 stops on purpose");
      return 0;
    }
    return expectWaitFails<RemoteError>(*seg, 1, 10, "on purpose");
  });
  runMembers("timeout", 2, [](const std::string& name, int me) {
    auto seg = HostSegment::connect(options(name, 2, me));
    if (me == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
      return 0;
    }
    return expectWaitFails<CollectiveTimeout>(*seg, 1, 0.3, "waiting for rank 1");
  });
  runMembers("dead member", 2, [](const std::string& name, int me) {
    if (me == 1) {
      // The victim is a child of this member's process: it connects, then is killed and reaped.
      pid_t victim = spawn([&] {
        auto seg = HostSegment::connect(options(name, 2, 1));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        kill(getpid(), SIGKILL);
        return 0;
      });
      reap({victim});
      return 0;
    }
    auto seg = HostSegment::connect(options(name, 2, 0));
    return expectWaitFails<RemoteError>(*seg, 1, 10, "died");
  });
}

// A wrong digest is refused by the opener, and the creator learns why.
void testWrongDigest() {
  runMembers("wrong digest", 2, [](const std::string& name, int me) {
    HostSegmentOptions o = options(name, 2, me);
    if (me == 1) o.authDigest = std::string(32, 'x');
    try {
      HostSegment::connect(o);
    } catch (const Error& e) {
      EXPECT(std::strstr(e.what(), "digest") != nullptr, "%s", e.what());
      return gFailures ? 1 : 0;
    }
    EXPECT(false, "member %d accepted the segment", me);
    return 1;
  });
}

// Yama's ptrace_scope 1 forbids siblings to read each other unless the read process says
// otherwise; letSiblingsRead says so where the setting is not 0, and nothing where it is 0 or
// absent. Here the setting comes from files this test writes (the kernel's own may be absent).
void testYamaScope() {
  const std::string dir = "/tmp/pc_yama_" + std::to_string(getpid());
  EXPECT(cross_memory::letSiblingsRead((dir + "_absent").c_str()).empty(), "no Yama");
  for (const char* scope : {"0\n", "1\n"}) {
    const std::string file = dir + "_" + scope[0];
    FILE* f = std::fopen(file.c_str(), "w");
    EXPECT(f != nullptr, "cannot write %s", file.c_str());
    if (f == nullptr) return;
    std::fputs(scope, f);
    std::fclose(f);
    const std::string said = cross_memory::letSiblingsRead(file.c_str());
    std::remove(file.c_str());
    if (scope[0] == '0') {
      EXPECT(said.empty(), "scope 0: %s", said.c_str());
    } else {
      // Where this kernel has Yama the call succeeds; without it prctl refuses the option.
      EXPECT(said.rfind("Yama's ptrace_scope is 1", 0) == 0, "scope 1: %s", said.c_str());
    }
  }
}

}  // namespace

int main() {
  registerAlgorithmNamer([](uint8_t index) { return index == 1 ? "ring" : "slots"; });
  alarm(600);  // nothing here may hang: a deadlock kills the test instead
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("host segment, %u CPUs\n", std::thread::hardware_concurrency());
  testCalls(2);
  testCalls(4);
  testStreamedPayloads();
  testLastArriverRetimes();
  testMismatch();
  testLinkCall();
  testFailures();
  testWrongDigest();
  testYamaScope();
  std::printf("%s: %d checks, %d failures\n", gFailures ? "FAILED" : "PASSED", gChecks, gFailures);
  return gFailures ? 1 : 0;
}
