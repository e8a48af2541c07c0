#pragma once
// The one table of PYCOLLECTIVE_* environment variables, for both sides: native code reads them
// through knobs::text()/integer()/number(), Python through _C.knob_table() and
// pycollective/config.py. Each is read once, when the process starts using pycollective (and
// again only on knobs::reload(), which Python calls when a group is created), never on a hot
// path. Arguments beat the environment; the environment beats the default.
#include <string>

namespace pycollective {
namespace knobs {

// X(id, NAME, type, default, meaning). Types: int, float, str. Keep the list sorted by use.
#define PYCOLLECTIVE_KNOB_TABLE(X)                                                                \
  X(kTimeout, "PYCOLLECTIVE_TIMEOUT", "float", "300",                                             \
    "Seconds a collective may take before it fails (timeout= overrides).")                        \
  X(kSegmentBytes, "PYCOLLECTIVE_SEGMENT_BYTES", "int", "262144",                                 \
    "Pipeline segment of the ring and chain algorithms, bytes.")                                  \
  X(kDeviceSegmentBytes, "PYCOLLECTIVE_DEVICE_SEGMENT_BYTES", "int", "16777216",                  \
    "Pipeline segment on device buffers (each step is a kernel), bytes.")                         \
  X(kReduceThreads, "PYCOLLECTIVE_REDUCE_THREADS", "int", "0",                                    \
    "Threads one large reduction may use (0: automatic).")                                        \
  X(kCacheBytes, "PYCOLLECTIVE_CACHE_BYTES", "int", "0",                                          \
    "Working set (bytes read and written) up to which in-process auto counts a call as in cache " \
    "(0: measured once per process: the last-level cache the OS reports, 8-64 MiB, when a pass "  \
    "over part of it confirms it, else a walk from 1 to 16 MiB).")                                \
  X(kAutoTrials, "PYCOLLECTIVE_AUTO_TRIALS", "int", "2",                                          \
    "Auto times the algorithms the model prices within 1.25x of its best and the tuned "          \
    "table's entry (at most 4) on this many counted calls each per shape, runs the fastest "      \
    "and keeps timing the others now and then; process groups measure calls the model prices "    \
    "at 5 us or more (all calls where a host's ranks outnumber its cores) and agree on the "      \
    "times across ranks (0: the model's or the table's choice alone, the same on every run; "     \
    "set it alike on every rank).")                                                               \
  X(kDebug, "PYCOLLECTIVE_DEBUG", "str", "WARN",                                                  \
    "Log level: NONE, WARN, INFO (algorithm choices, links) or TRACE.")                           \
  X(kDebugSubsys, "PYCOLLECTIVE_DEBUG_SUBSYS", "str", "ALL",                                      \
    "Subsystems INFO/TRACE cover: INIT, COLL, TRANSPORT, TUNING, NCCL, STRATEGIES, PS; "          \
    "ALL, or ^LIST for all but those.")                                                           \
  X(kSimd, "PYCOLLECTIVE_SIMD", "str", "",                                                        \
    "Force the CPU kernel set: generic, avx2 or avx512 (default: the best the CPU has).")         \
  X(kTransport, "PYCOLLECTIVE_TRANSPORT", "str", "",                                              \
    "Force the transport between processes: shm, tcp or grpc.")                                   \
  X(kIfname, "PYCOLLECTIVE_IFNAME", "str", "",                                                    \
    "Interface (or address) every server of a rank binds: coordinator, data listeners, "          \
    "parameter-server tasks; 0.0.0.0 for all. Unset: the address toward the coordinator "         \
    "(loopback for a single-host job).")                                                          \
  X(kToken, "PYCOLLECTIVE_TOKEN", "str", "",                                                      \
    "Cluster token every control and data connection must carry (a secret).")                     \
  X(kTlsCert, "PYCOLLECTIVE_TLS_CERT", "str", "",                                                 \
    "PEM certificate (chain) this process presents on every gRPC connection, as server and "      \
    "client; with PYCOLLECTIVE_TLS_KEY and PYCOLLECTIVE_TLS_CA: mutual TLS.")                     \
  X(kTlsKey, "PYCOLLECTIVE_TLS_KEY", "str", "", "PEM private key of PYCOLLECTIVE_TLS_CERT.")      \
  X(kTlsCa, "PYCOLLECTIVE_TLS_CA", "str", "",                                                     \
    "PEM CA certificate(s) a peer's certificate must chain to (gRPC refuses any other).")         \
  X(kDataEncrypt, "PYCOLLECTIVE_DATA_ENCRYPT", "int", "0",                                        \
    "1: tcp data links carry AES-256-GCM records (OpenSSL's libcrypto, loaded at run time); "     \
    "the same on every rank.")                                                                    \
  X(kTokenFile, "PYCOLLECTIVE_TOKEN_FILE", "str", "",                                             \
    "File holding the cluster token when PYCOLLECTIVE_TOKEN is unset (default "                   \
    "~/.config/pycollective/token; owner-only, see `pycollective token`).")                       \
  X(kHostId, "PYCOLLECTIVE_HOST_ID", "str", "",                                                   \
    "Overrides this host's identity (tests fake several hosts on one machine).")                  \
  X(kTuning, "PYCOLLECTIVE_TUNING", "str", "",                                                    \
    "Table written by `pycollective tune` that algo='auto' follows.")                             \
  X(kLinkGbits, "PYCOLLECTIVE_LINK_GBITS", "float", "",                                           \
    "Each host's network link, Gbit/s each way, as algo='auto' models it (the host's ranks "      \
    "share it). Unset: the host link measured into PYCOLLECTIVE_TUNING, else the tcp default.")   \
  X(kHeartbeatTimeout, "PYCOLLECTIVE_HEARTBEAT_TIMEOUT", "float", "6",                            \
    "Seconds without a heartbeat after which a rank counts as frozen (a freeze or a partition "   \
    "is reported within about this plus 2 s).")                                                   \
  X(kConnectTimeout, "PYCOLLECTIVE_CONNECT_TIMEOUT", "float", "60",                               \
    "Seconds a rank waits for the group to form.")                                                \
  X(kElasticStore, "PYCOLLECTIVE_ELASTIC_STORE", "str", "",                                       \
    "host:port of the elastic rendezvous (set by `pycollective run -n MIN:MAX`): init() joins "   \
    "the group that forms there.")                                                                \
  X(kShmRingBytes, "PYCOLLECTIVE_SHM_RING_BYTES", "int", "4194304",                               \
    "Size of each shared-memory link's ring, bytes.")                                             \
  X(kHostSegment, "PYCOLLECTIVE_HOST_SEGMENT", "int", "1",                                        \
    "1: the ranks of a host share one segment, through which their small collectives (algo "      \
    "'slots') and large allreduces, reduce-scatters and allgathers (algo 'staged') run; 0: "      \
    "none, every collective over links.")                                                         \
  X(kHostSlotBytes, "PYCOLLECTIVE_HOST_SLOT_BYTES", "int", "16384",                               \
    "Largest call (bytes per rank) algo 'slots' runs through the host segment; a multiple of "    \
    "64, the same on every rank.")                                                                \
  X(kHostPieceBytes, "PYCOLLECTIVE_HOST_PIECE_BYTES", "int", "",                                  \
    "Bytes per rank of each piece in which algo 'staged' moves a large collective through the "   \
    "host segment (unset: 1048576 where the host has 2 ranks, else 524288); a multiple of 64, "   \
    "the same on every rank. The segment keeps two slots of the larger of this and "              \
    "PYCOLLECTIVE_HOST_SLOT_BYTES per rank.")                                                     \
  X(kCrossMemory, "PYCOLLECTIVE_CROSS_MEMORY", "int", "1",                                        \
    "1: two ranks of a host read each other's buffers directly (process_vm_readv) where the "     \
    "kernel lets them: their allgathers of 16 KiB-16 MiB a rank, reduce-scatters from 256 KiB "   \
    "and allreduces of 256 KiB-16 MiB (algo 'staged') copy each byte once (under Yama's "         \
    "ptrace_scope 1 each rank lets its user's processes trace it, PR_SET_PTRACER_ANY); 0: "       \
    "through the host segment, the ptrace setting left alone. The ranks agree: one rank's 0 "     \
    "turns it off for its host.")                                                                 \
  X(kBind, "PYCOLLECTIVE_BIND", "str", "auto",                                                    \
    "Bind each rank to one core, round-robin by local rank: auto (where a host's ranks are at "   \
    "least as many as its CPUs), core (always) or none.")                                         \
  X(kOutputPoolBytes, "PYCOLLECTIVE_OUTPUT_POOL_BYTES", "int", "1073741824",                      \
    "Result arrays of at least 1 MiB freed by the user kept for reuse, at most this many bytes "  \
    "(0: none; fresh memory page-faults on first touch).")                                        \
  X(kCpuReplicas, "PYCOLLECTIVE_CPU_REPLICAS", "int", "0",                                        \
    "CPU replicas of MirroredStrategy (0: one per core).")                                        \
  X(kHierarchicalGroupSize, "PYCOLLECTIVE_HIERARCHICAL_GROUP_SIZE", "int", "0",                   \
    "Replicas per group of in-process hierarchical all-reduce (0: automatic).")                   \
  X(kNcclLibrary, "PYCOLLECTIVE_NCCL_LIBRARY", "str", "",                                         \
    "libnccl.so.2 (a file, or a folder holding it) to load instead of searching.")                \
  X(kRank, "PYCOLLECTIVE_RANK", "int", "", "This process's rank (set by `pycollective run`).")    \
  X(kWorldSize, "PYCOLLECTIVE_WORLD_SIZE", "int", "", "Number of ranks (set by the launcher).")   \
  X(kLocalRank, "PYCOLLECTIVE_LOCAL_RANK", "int", "", "Rank among this host's ranks.")            \
  X(kLocalSize, "PYCOLLECTIVE_LOCAL_SIZE", "int", "", "Ranks on this host.")                      \
  X(kMasterAddr, "PYCOLLECTIVE_MASTER_ADDR", "str", "", "Host of rank 0's coordination service.") \
  X(kMasterPort, "PYCOLLECTIVE_MASTER_PORT", "int", "", "Port of rank 0's coordination service.") \
  X(kPackageDir, "PYCOLLECTIVE_PACKAGE_DIR", "str", "",                                           \
    "Set by pycollective for the processes it starts: the package they import.")                  \
  X(kCuda, "PYCOLLECTIVE_CUDA", "str", "AUTO",                                                    \
    "Build time: compile the CUDA kernels (AUTO, ON or OFF).")                                    \
  X(kWerror, "PYCOLLECTIVE_WERROR", "str", "OFF", "Build time: warnings are errors (ON, OFF).")

enum Knob : int {
#define PYCOLLECTIVE_KNOB_ID(id, name, type, def, doc) id,
  PYCOLLECTIVE_KNOB_TABLE(PYCOLLECTIVE_KNOB_ID)
#undef PYCOLLECTIVE_KNOB_ID
      kNumKnobs
};

struct KnobInfo {
  const char* name;
  const char* type;
  const char* defaultValue;
  const char* meaning;
};
const KnobInfo& info(Knob k);

// The variable's value as set when the table was last read, or its default when unset/empty.
std::string text(Knob k);
// Parsed; a malformed value is an error naming the variable.
long long integer(Knob k);
double number(Knob k);
// Reads the environment again (a new group, or a test that changed a variable).
void reload();

}  // namespace knobs
}  // namespace pycollective
