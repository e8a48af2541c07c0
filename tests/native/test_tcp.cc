// Standalone test of the tcp transport's wire (csrc/transport/tcp.cc) against what a network or an
// attacker can do to it. Two links talk through socket pairs that this program relays, so it can
// read, alter, cut, replay, reorder or drop the bytes in between:
//  - AES-256-GCM against the GCM specification's test case 16 (transport/aead.h);
//  - encrypted links: the data arrives intact, no plaintext crosses the wire, and every altered,
//    replayed, reordered, dropped, cut or foreign-key record is refused: never a completed
//    receive with other data;
//  - a fuzzer of frames on plaintext links: mutated headers, cut frames, oversized lengths,
//    replayed frames and garbage must all fail the receive (ProtocolError, or RemoteError when the
//    stream ends), never complete it, never crash (CI runs this under AddressSanitizer).
//
//   test_tcp                   every check, fuzzing 2,000 inputs per kind
//   test_tcp --iterations N    the same with N inputs per kind (the soak run uses 100,000)
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "expect.h"
#include "transport/aead.h"
#include "transport/frame.h"
#include "transport/tcp.h"

using namespace pycollective;

namespace {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

Bytes fromHex(const char* hex) {
  Bytes out;
  for (size_t i = 0; hex[i] != '\0' && hex[i + 1] != '\0'; i += 2)
    out.push_back(static_cast<uint8_t>(std::strtoul(std::string(hex + i, 2).c_str(), nullptr, 16)));
  return out;
}

void checkAesGcmVector() {
  // "The Galois/Counter Mode of Operation (GCM)", McGrew and Viega, test case 16.
  Bytes key = fromHex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308");
  Bytes iv = fromHex("cafebabefacedbaddecaf888");
  Bytes plain = fromHex(
      "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6"
      "b525b16aedf5aa0de657ba637b39");
  Bytes aad = fromHex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
  Bytes cipher = fromHex(
      "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056"
      "828838c5f61e6393ba7a0abcc9f662");
  Bytes tag = fromHex("76fc6ece0f4e1768cddf8853bb2d551b");
  Aes256Gcm gcm(std::string(key.begin(), key.end()));
  Bytes out(plain.size());
  uint8_t gotTag[16];
  gcm.seal(iv.data(), aad.data(), aad.size(), plain.data(), plain.size(), out.data(), gotTag);
  EXPECT(out == cipher, "AES-256-GCM ciphertext differs from the test vector");
  EXPECT(std::memcmp(gotTag, tag.data(), 16) == 0, "AES-256-GCM tag differs from the test vector");
  Bytes back(cipher.size());
  EXPECT(gcm.open(iv.data(), aad.data(), aad.size(), cipher.data(), cipher.size(), back.data(),
                  tag.data()) &&
             back == plain,
         "the test vector does not decrypt");
  Bytes badTag = tag;
  badTag[0] ^= 1;
  EXPECT(!gcm.open(iv.data(), aad.data(), aad.size(), cipher.data(), cipher.size(), back.data(),
                   badTag.data()),
         "a wrong tag was accepted");
  Bytes badAad = aad;
  badAad.back() ^= 0x80;
  EXPECT(!gcm.open(iv.data(), badAad.data(), badAad.size(), cipher.data(), cipher.size(),
                   back.data(), tag.data()),
         "altered associated data was accepted");
}

struct Pair {
  int link = -1, relay = -1;  // the link's end, and the end this program reads or writes
};

Pair socketPair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    std::perror("socketpair");
    std::exit(2);
  }
  ::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL, 0) | O_NONBLOCK);
  return {fds[0], fds[1]};
}

std::unique_ptr<Link> makeLink(int fd, int rank, int peer, const std::string& key) {
  TcpLinkOptions o;
  o.fd = fd;
  o.rank = rank;
  o.peer = peer;
  o.peerAddress = "socketpair";
  o.stagingBytes = 4096;
  o.key = key;
  return makeTcpLink(o);
}

FrameHeader header(uint64_t seq, uint64_t bytes) {
  FrameHeader h;
  h.seq = seq;
  h.step = 1;
  h.count = bytes / 4;
  h.bytes = bytes;
  h.kind = static_cast<uint8_t>(CollectiveKind::kAllreduce);
  h.dtype = 0;
  h.algo = 0;
  return h;
}

// The bytes `sender` puts on the wire for each payload (sequence numbers 0, 1, ...).
Bytes capture(Link& sender, int relay, const std::vector<Bytes>& payloads) {
  std::vector<RequestPtr> sends;
  for (size_t i = 0; i < payloads.size(); ++i)
    sends.push_back(
        sender.postSend(payloads[i].data(), payloads[i].size(), header(i, payloads[i].size())));
  Bytes wire;
  uint8_t buf[1 << 16];
  auto allSent = [&] {
    return std::all_of(sends.begin(), sends.end(),
                       [](const RequestPtr& r) { return r->done.load(); });
  };
  for (;;) {
    sender.progress();
    ssize_t r;
    while ((r = ::recv(relay, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
      wire.insert(wire.end(), buf, buf + r);
    if (allSent()) {
      while ((r = ::recv(relay, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
        wire.insert(wire.end(), buf, buf + r);
      return wire;
    }
  }
}

enum class Outcome { kCompleted, kProtocolError, kRemoteError, kWaiting };

const char* outcomeName(Outcome o) {
  switch (o) {
    case Outcome::kCompleted: return "completed";
    case Outcome::kProtocolError: return "ProtocolError";
    case Outcome::kRemoteError: return "RemoteError";
    default: return "still waiting";
  }
}

// Feeds `wire` to `receiver`, which expects `payloads` (sequence numbers 0, 1, ...); closes the
// stream afterwards when `close` is set. `received` gets what arrived.
Outcome deliver(Link& receiver, int relay, const Bytes& wire, const std::vector<Bytes>& payloads,
                bool close, std::vector<Bytes>* received, std::string* message) {
  received->assign(payloads.size(), Bytes());
  std::vector<RequestPtr> recvs;
  for (size_t i = 0; i < payloads.size(); ++i) {
    (*received)[i].assign(payloads[i].size(), 0);
    RecvSpec spec;
    spec.dst = (*received)[i].data();
    spec.bytes = payloads[i].size();
    recvs.push_back(receiver.postRecv(spec, header(i, payloads[i].size())));
  }
  size_t written = 0;
  bool closed = false;
  auto idleSince = Clock::now();
  for (;;) {
    bool moved = false;
    if (written < wire.size()) {
      ssize_t w =
          ::send(relay, wire.data() + written, wire.size() - written, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0) {
        written += static_cast<size_t>(w);
        moved = true;
      }
    } else if (close && !closed) {
      ::shutdown(relay, SHUT_WR);
      closed = true;
    }
    try {
      moved |= receiver.progress();
    } catch (const ProtocolError& e) {
      *message = e.what();
      return Outcome::kProtocolError;
    } catch (const RemoteError& e) {
      *message = e.what();
      return Outcome::kRemoteError;
    }
    if (std::all_of(recvs.begin(), recvs.end(), [](const RequestPtr& r) { return r->done.load(); }))
      return Outcome::kCompleted;
    if (moved) idleSince = Clock::now();
    if (std::chrono::duration<double>(Clock::now() - idleSince).count() > 0.2)
      return Outcome::kWaiting;
  }
}

Bytes randomBytes(std::mt19937_64& rng, size_t n) {
  Bytes out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

const std::string kKey(32, 'k');

// One trip: payloads captured from a sender with `sendKey`, altered by `mutate`, fed to a
// receiver with `recvKey`.
template <typename Mutate>
Outcome trip(const std::vector<Bytes>& payloads, const std::string& sendKey,
             const std::string& recvKey, Mutate mutate, bool close, std::vector<Bytes>* received,
             std::string* message, Bytes* wireOut = nullptr) {
  Pair a = socketPair(), b = socketPair();
  auto sender = makeLink(a.link, 0, 1, sendKey);
  auto receiver = makeLink(b.link, 1, 0, recvKey);
  Bytes wire = capture(*sender, a.relay, payloads);
  mutate(wire);
  if (wireOut != nullptr) *wireOut = wire;
  Outcome o = deliver(*receiver, b.relay, wire, payloads, close, received, message);
  ::close(a.relay);
  ::close(b.relay);
  return o;
}

// Record boundaries of an encrypted wire: offsets of each record's start.
std::vector<size_t> records(const Bytes& wire) {
  std::vector<size_t> starts;
  for (size_t at = 0; at + 4 <= wire.size();) {
    starts.push_back(at);
    size_t n = (size_t(wire[at]) << 24) | (size_t(wire[at + 1]) << 16) |
               (size_t(wire[at + 2]) << 8) | wire[at + 3];
    at += 4 + n + Aes256Gcm::kTagBytes;
  }
  return starts;
}

void checkEncryptedRoundTrips(std::mt19937_64& rng) {
  for (size_t size : {size_t(0), size_t(1), kTcpRecordBytes - sizeof(FrameHeader),
                      kTcpRecordBytes - sizeof(FrameHeader) + 1, size_t(3) << 20}) {
    std::vector<Bytes> payloads = {randomBytes(rng, size), randomBytes(rng, 1000)};
    std::vector<Bytes> got;
    std::string msg;
    Bytes wire;
    Outcome o = trip(payloads, kKey, kKey, [](Bytes&) {}, false, &got, &msg, &wire);
    EXPECT(o == Outcome::kCompleted, "%zu bytes: %s %s", size, outcomeName(o), msg.c_str());
    EXPECT(got == payloads, "%zu bytes arrived altered", size);
    size_t plain = 2 * sizeof(FrameHeader) + size + 1000;
    EXPECT(wire.size() == plain + records(wire).size() * (4 + Aes256Gcm::kTagBytes),
           "%zu bytes: %zu bytes on the wire for %zu records", size, wire.size(),
           records(wire).size());
    // No 16-byte run of the payload crosses the wire in the clear.
    for (size_t at = 0; at + 16 <= size; at += std::max<size_t>(size / 64, 16))
      EXPECT(std::search(wire.begin(), wire.end(), payloads[0].begin() + at,
                         payloads[0].begin() + at + 16) == wire.end(),
             "plaintext at offset %zu of %zu crossed the wire", at, size);
  }
}

void checkEncryptedTampering(std::mt19937_64& rng, int iterations) {
  std::vector<Bytes> payloads = {randomBytes(rng, 150000), randomBytes(rng, 333)};
  int refused = 0;
  for (int i = 0; i < iterations; ++i) {
    std::vector<Bytes> got;
    std::string msg;
    size_t pos = 0;
    int bit = static_cast<int>(rng() % 8);
    Outcome o = trip(
        payloads, kKey, kKey,
        [&](Bytes& w) {
          pos = rng() % w.size();
          w[pos] ^= static_cast<uint8_t>(1u << bit);
        },
        true, &got, &msg);
    EXPECT(o == Outcome::kProtocolError || o == Outcome::kRemoteError,
           "a flipped bit at byte %zu was not refused: %s", pos, outcomeName(o));
    refused += o != Outcome::kCompleted;
  }
  EXPECT(refused == iterations, "%d of %d altered streams refused", refused, iterations);

  struct Case {
    const char* what;
    void (*mutate)(Bytes&);
  };
  const Case cases[] = {
      {"replayed record",
       [](Bytes& w) {
         auto r = records(w);
         Bytes first(w.begin(), w.begin() + r[1]);
         w.insert(w.begin() + r[1], first.begin(), first.end());
       }},
      {"reordered records",
       [](Bytes& w) {
         auto r = records(w);
         Bytes a(w.begin() + r[0], w.begin() + r[1]), b(w.begin() + r[1], w.begin() + r[2]);
         Bytes out = b;
         out.insert(out.end(), a.begin(), a.end());
         out.insert(out.end(), w.begin() + r[2], w.end());
         w = out;
       }},
      {"dropped record",
       [](Bytes& w) {
         auto r = records(w);
         w.erase(w.begin() + r[1], w.begin() + r[2]);
       }},
      {"cut stream", [](Bytes& w) { w.resize(w.size() / 2); }},
      {"oversized record",
       [](Bytes& w) {
         w[0] = 0x40;  // a 1 GiB record
       }},
  };
  for (const Case& c : cases) {
    std::vector<Bytes> got;
    std::string msg;
    Outcome o = trip(payloads, kKey, kKey, c.mutate, true, &got, &msg);
    EXPECT(o == Outcome::kProtocolError || o == Outcome::kRemoteError, "%s: %s", c.what,
           outcomeName(o));
    EXPECT(msg.find("rank 0") != std::string::npos, "%s: the error does not name the peer: %s",
           c.what, msg.c_str());
  }
  std::vector<Bytes> got;
  std::string msg;
  Outcome o = trip(payloads, kKey, std::string(32, 'x'), [](Bytes&) {}, true, &got, &msg);
  EXPECT(o == Outcome::kProtocolError && msg.find("fails authentication") != std::string::npos,
         "another key: %s %s", outcomeName(o), msg.c_str());
  o = trip(payloads, "", kKey, [](Bytes&) {}, true, &got, &msg);
  EXPECT(o == Outcome::kProtocolError && msg.find("PYCOLLECTIVE_DATA_ENCRYPT") != std::string::npos,
         "a plaintext sender to an encrypting receiver: %s %s", outcomeName(o), msg.c_str());
}

// Frames on plaintext links: whatever arrives in place of the expected frame must fail the
// receive; only the frame itself completes it.
void fuzzPlainFrames(std::mt19937_64& rng, int iterations) {
  int counts[4] = {0, 0, 0, 0};
  for (int i = 0; i < iterations; ++i) {
    std::vector<Bytes> payloads = {randomBytes(rng, 1 + rng() % 2000)};
    const int kind = static_cast<int>(rng() % 5);
    std::vector<Bytes> got;
    std::string msg;
    const char* names[] = {"mutated header", "cut frame", "oversized length", "garbage",
                           "replayed frame"};
    Outcome o;
    if (kind == 4) {
      // The sender's first frame twice, where the receiver expects seq 0 then seq 1.
      std::vector<Bytes> two = {payloads[0], payloads[0]};
      o = trip(
          payloads, "", "",
          [](Bytes& w) {
            Bytes copy = w;
            w.insert(w.end(), copy.begin(), copy.end());
          },
          true, &got, &msg);
      // The first receive completes: then the replay must fail the second.
      if (o == Outcome::kCompleted) {
        Pair a = socketPair(), b = socketPair();
        auto sender = makeLink(a.link, 0, 1, "");
        auto receiver = makeLink(b.link, 1, 0, "");
        Bytes wire = capture(*sender, a.relay, payloads);
        wire.insert(wire.end(), wire.begin(), wire.end());
        o = deliver(*receiver, b.relay, wire, two, true, &got, &msg);
        ::close(a.relay);
        ::close(b.relay);
      }
    } else {
      o = trip(
          payloads, "", "",
          [&](Bytes& w) {
            if (kind == 0) {
              // Every field but the two reserved bytes, which carry nothing.
              size_t at = rng() % offsetof(FrameHeader, reserved);
              w[at] ^= static_cast<uint8_t>(1 + rng() % 255);
            } else if (kind == 1) {
              w.resize(rng() % w.size());
            } else if (kind == 2) {
              uint64_t huge = (uint64_t(1) << 40) + rng() % 1000;
              std::memcpy(w.data() + offsetof(FrameHeader, bytes), &huge, sizeof(huge));
            } else {
              w = randomBytes(rng, rng() % 4000);
            }
          },
          true, &got, &msg);
    }
    EXPECT(o == Outcome::kProtocolError || o == Outcome::kRemoteError, "%s: %s (%s)", names[kind],
           outcomeName(o), msg.c_str());
    counts[static_cast<int>(o)]++;
  }
  std::printf(
      "fuzzed %d plaintext frames: %d completed, %d ProtocolError, %d RemoteError, %d hung\n",
      iterations, counts[0], counts[1], counts[2], counts[3]);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 2000;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc)
      iterations = std::atoi(argv[++i]);
  std::mt19937_64 rng(20261202);
  bool haveCipher = true;
  try {
    std::printf("cipher: %s\n", Aes256Gcm::describeLibrary().c_str());
  } catch (const Error& e) {
    std::printf("encrypted-link checks skipped: %s\n", e.what());
    haveCipher = false;
  }
  if (haveCipher) {
    checkAesGcmVector();
    checkEncryptedRoundTrips(rng);
    checkEncryptedTampering(rng, iterations / 10);
  }
  fuzzPlainFrames(rng, iterations);
  std::printf("%d checks, %d failures\n", gChecks, gFailures);
  return gFailures == 0 ? 0 : 1;
}
