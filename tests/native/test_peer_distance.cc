// PeerDistance (transport/peer_distance.h): a shm link streams its long ring pieces past the
// cache only while the median of its last window of timed loads says the peer's core is far;
// odd loads in a window (an interrupt, a moment on one core) change nothing; a change of place
// shows after one window; short pieces never stream; and only loads that bring a value the peer
// wrote since are timed.
#include <atomic>
#include <cstdio>

#include "expect.h"
#include "transport/peer_distance.h"

using namespace pycollective;

namespace {

constexpr size_t kLong = 256 << 10;

void feed(PeerDistance& d, int samples, double ns) {
  for (int i = 0; i < samples; ++i) d.addSample(ns + (i % 3));  // a little spread above ns
}

}  // namespace

int main() {
  const int w = PeerDistance::kWindow;
  {
    PeerDistance d;
    EXPECT(!d.stream(kLong) && d.nanoseconds() == 0, "no loads timed yet, yet streaming");  // first
    feed(d, w - 1, 180);
    EXPECT(!d.stream(kLong), "streaming before a window was full");
    feed(d, 1, 180);
    EXPECT(d.stream(kLong), "far (180 ns) for a window: not streaming (%.1f ns)", d.nanoseconds());
    EXPECT(!d.stream(PeerDistance::kMinStreamedBytes - 8), "a short piece streamed");
    // Far with a few near loads (both processes on one core for a moment): still far.
    for (int i = 0; i < w; ++i) d.addSample(i < w / 4 ? 30 : 150);
    EXPECT(d.stream(kLong), "a quarter of near loads ended streaming (%.1f ns)", d.nanoseconds());
    // Near for a window: ordinary stores again.
    feed(d, w, 40);
    EXPECT(!d.stream(kLong), "near (40 ns) for a window: still streaming (%.1f ns)",
           d.nanoseconds());
    // Near with a few interrupted loads: still near.
    for (int i = 0; i < w; ++i) d.addSample(i < w / 4 ? 5000 : 40);
    EXPECT(!d.stream(kLong), "a quarter of long loads made a near peer far");
  }
  {
    // Deciding by the 6th sample of 8 (the host segment, whose members may share a core): five
    // loads that found the line on this core leave a far window far; two interrupted loads
    // leave a near one near.
    PeerDistance d(5);
    for (int i = 0; i < w; ++i) d.addSample(i < 5 ? 25 : 140);
    EXPECT(d.far(), "five same-core loads of eight made far cores near (%.1f ns)", d.nanoseconds());
    for (int i = 0; i < w; ++i) d.addSample(i < 6 ? 25 : 140);
    EXPECT(!d.far(), "six near loads of eight still far (%.1f ns)", d.nanoseconds());
    for (int i = 0; i < w; ++i) d.addSample(i < 2 ? 5000 : 50);
    EXPECT(!d.far(), "two interrupted loads made a near window far (%.1f ns)", d.nanoseconds());
  }
  {
    // A link with no window of its own follows the last window of any link of the process.
    PeerDistance a, b;
    feed(a, w, 180);
    EXPECT(b.stream(kLong), "a fresh link did not follow a far link (%.1f ns)", b.nanoseconds());
    feed(a, w, 40);
    EXPECT(!b.stream(kLong), "a fresh link did not follow a near link");
    feed(b, w, 180);
    feed(a, w, 40);
    EXPECT(b.stream(kLong), "a link with its own window followed another's");
  }
  {
    // Only a load that brings a new value is timed.
    PeerDistance d;
    std::atomic<uint64_t> counter{5};
    for (int i = 0; i < w; ++i) EXPECT(d.load(counter, 5) == 5, "load returned the wrong value");
    PeerDistance fresh;
    EXPECT(d.nanoseconds() == fresh.nanoseconds(), "loads of an unchanged counter were timed");
#if defined(__x86_64__)
    for (int i = 0; i < w; ++i) {
      counter.store(6 + i);
      EXPECT(d.load(counter, 5 + i) == static_cast<uint64_t>(6 + i), "wrong value");
    }
    // The counter is in this thread's cache: near, whatever the machine.
    EXPECT(d.nanoseconds() > 0 && !d.stream(kLong), "a window of changed loads: %.1f ns",
           d.nanoseconds());
#endif
  }
  std::printf("peer_distance: %d checks, %d failures\n", gChecks, gFailures);
  return gFailures == 0 ? 0 : 1;
}
