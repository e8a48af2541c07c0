// RingStoreChoice (transport/ring_stores.h): a shm link's sender streams its pieces past the
// cache only while its ordinary copy into the ring runs clearly slower, keeps timing the kind it
// does not use, follows a change of placement both ways, and leaves short pieces alone.
#include <cstdio>

#include "expect.h"
#include "transport/ring_stores.h"

using namespace pycollective;

namespace {

constexpr size_t kPiece = 256 << 10;

// Runs `pieces` pieces through `c` with the given copy rates (bytes per second); returns how
// many were streamed.
int run(RingStoreChoice& c, int pieces, double ordinaryRate, double streamingRate) {
  int streamed = 0;
  for (int i = 0; i < pieces; ++i) {
    const bool s = c.streamNext(kPiece);
    streamed += s;
    c.record(s, kPiece, kPiece / (s ? streamingRate : ordinaryRate));
  }
  return streamed;
}

}  // namespace

int main() {
  const int period = static_cast<int>(RingStoreChoice::kExplorePeriod);
  {
    // Near (rates of the 2-vCPU VM with its vCPUs close): ordinary stores, streaming tried once
    // a period after the first two pieces measured both.
    RingStoreChoice c;
    EXPECT(!c.streamNext(kPiece), "the first piece is ordinary");
    int streamed = run(c, 10 * period, 18e9, 15e9);
    EXPECT(!c.streaming(), "near: chose streaming (rates %.1f / %.1f GB/s)", c.rate(false) / 1e9,
           c.rate(true) / 1e9);
    EXPECT(streamed >= 10 && streamed <= 12, "near: %d of %d pieces streamed", streamed,
           10 * period);
  }
  {
    // Far: streaming, with one ordinary piece a period; then near again: back to ordinary.
    RingStoreChoice c;
    int streamed = run(c, 10 * period, 3e9, 18e9);
    EXPECT(c.streaming(), "far: did not choose streaming");
    EXPECT(streamed >= 10 * period - 11, "far: only %d of %d pieces streamed", streamed,
           10 * period);
    run(c, 20 * period, 18e9, 15e9);
    EXPECT(!c.streaming(), "near again: still streaming (rates %.1f / %.1f GB/s)",
           c.rate(false) / 1e9, c.rate(true) / 1e9);
    run(c, 20 * period, 3e9, 18e9);
    EXPECT(c.streaming(), "far again: did not go back to streaming");
  }
  {
    // A little slower is not enough: the receiver pays for streaming when the cores are close.
    RingStoreChoice c;
    run(c, 10 * period, 10e9, 13e9);
    EXPECT(!c.streaming(), "streamed for a 1.3x difference");
  }
  {
    // Short pieces: ordinary and untimed, whatever the rates.
    RingStoreChoice c;
    run(c, 10 * period, 3e9, 18e9);
    EXPECT(!c.streamNext(RingStoreChoice::kMinTimedBytes - 8), "streamed a short piece");
    const double before = c.rate(false);
    c.record(false, 1024, 1.0);
    EXPECT(c.rate(false) == before, "a short piece moved the rate");
  }
  std::printf("ring_stores: %d checks, %d failures\n", gChecks, gFailures);
  return gFailures == 0 ? 0 : 1;
}
