"""
pycollective native core
"""
from __future__ import annotations
import collections.abc
import numpy
import typing
__all__: list[str] = ['BridgeEnd', 'CallSpec', 'Communicator', 'KnownLayouts', 'Link', 'LocalGroup', 'Members', 'NcclComm', 'OutputBuffer', 'PARKED_PEER_SECONDS', 'POOLED_OUTPUT_BYTES', 'PreparedCallBase', 'PreparedCollective', 'Work', 'algorithms', 'allreduce_update', 'apply_replicated_update', 'bridge_link', 'build_info', 'cache_line_round_trip_ns', 'cache_resident_bytes', 'cuda_copy', 'cuda_describe', 'cuda_device_count', 'cuda_free', 'cuda_malloc', 'cuda_pointer_device', 'cuda_reduce', 'cuda_scale', 'cuda_synchronize', 'data_cipher_library', 'enum_codes', 'knob_table', 'line_from_passes', 'line_with_reported_cache', 'memory_bandwidth', 'model_estimates', 'nccl_available', 'nccl_group_end', 'nccl_group_start', 'nccl_library', 'nccl_probe', 'nccl_search_order', 'nccl_set_wheel_dirs', 'nccl_unique_id', 'new_result', 'output_pool_cached_bytes', 'parse_cache_size', 'reduce_into', 'reload_knobs', 'round_to_wire', 'scale', 'set_log_rank', 'shm_link', 'tcp_link']
class CallSpec:
    """
    One collective call: kind, element count and dtype (codes from enum_codes()), reduce op, root, algorithm, the shape's hash (mismatch detection), pipeline segment bytes (0: the default), timeout in seconds (0: the group's) and wire format (0: native, 1: bf16, 2: fp16 on network links). Checked when built; reusable.
    """
    def __init__(self, *, kind: typing.SupportsInt | typing.SupportsIndex, count: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, op: typing.SupportsInt | typing.SupportsIndex = 0, root: typing.SupportsInt | typing.SupportsIndex = 0, algo: str = 'auto', shape_hash: typing.SupportsInt | typing.SupportsIndex = 0, segment_bytes: typing.SupportsInt | typing.SupportsIndex = 0, timeout: typing.SupportsFloat | typing.SupportsIndex = 0.0, wire: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        ...
    def __repr__(self) -> str:
        ...
    @property
    def algo(self) -> str:
        ...
    @property
    def count(self) -> int:
        ...
    @property
    def dtype(self) -> int:
        ...
    @property
    def kind(self) -> int:
        ...
    @property
    def op(self) -> int:
        ...
    @property
    def root(self) -> int:
        ...
    @property
    def segment_bytes(self) -> int:
        ...
    @property
    def shape_hash(self) -> int:
        ...
    @property
    def timeout(self) -> float:
        ...
    @property
    def wire(self) -> int:
        ...
class OutputBuffer:
    """
    Writable memory for a result array, reused from the output pool when a block of its size was released (PYCOLLECTIVE_OUTPUT_POOL_BYTES).
    """
    def __init__(self, nbytes: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class LocalGroup:
    @typing.overload
    def __init__(self, *, size: typing.SupportsInt | typing.SupportsIndex, timeout: typing.SupportsFloat | typing.SupportsIndex, group_size: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        ...
    @typing.overload
    def __init__(self, *, worker: typing.SupportsInt | typing.SupportsIndex, num_workers: typing.SupportsInt | typing.SupportsIndex, links: collections.abc.Sequence[collections.abc.Sequence[typing.Any]], host_of_worker: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], timeout: typing.SupportsFloat | typing.SupportsIndex) -> None:
        """
        This process's replicas in a group across processes: links[l][w] joins local replica l to replica l of worker w (None at this worker). Runs hierarchical all-reduce only.
        """
    def abort(self, reason: str) -> None:
        """
        Fails every pending and future collective; peers stop waiting.
        """
    def explain(self, spec: CallSpec) -> str:
        """
        What algo="auto" would run for this call.
        """
    def run(self, spec: CallSpec, *, ins: list, outs: list) -> None:
        """
        Runs the call on every replica at once: ins[r]/outs[r] are replica r's arrays.
        """
    def run_device(self, spec: CallSpec, *, ins: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], outs: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], devices: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], streams: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        """
        Like run, on device pointers (0 for none): replica r's buffers live on devices[r] and are ordered on streams[r]. Returns when every replica's result is complete.
        """
    def set_costs(self, cost: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex]) -> None:
        ...
    def set_tuned(self, table: collections.abc.Sequence[tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex, str]]) -> None:
        ...
    @property
    def auto_trial_calls(self) -> int:
        """
        The most calls of one shape algo='auto' times before it settles.
        """
    @property
    def num_workers(self) -> int:
        ...
    @property
    def size(self) -> int:
        ...
class Link:
    def __repr__(self) -> str:
        ...
class BridgeEnd:
    """
    The pump side of a bridged (grpc) link.
    """
    def deliver(self, header: str, payload: str) -> None:
        ...
    def fail(self, reason: str) -> None:
        ...
    def take_outgoing(self, timeout: typing.SupportsFloat | typing.SupportsIndex) -> typing.Any:
        """
        Next outgoing (header, payload), or None after `timeout` s or once the end failed.
        """
    @property
    def failed(self) -> bool:
        ...
class Work:
    def is_completed(self) -> bool:
        ...
    def wait(self, timeout: typing.SupportsFloat | typing.SupportsIndex = -1.0) -> bool:
        """
        Waits (timeout < 0: until done); False if still running; re-raises the failure.
        """
    @property
    def seconds(self) -> float:
        ...
class Members:
    """
    The global ranks of a (sub)group, ascending, and its group id (keeps its sequence numbers apart from other groups').
    """
    def __init__(self, *, ranks: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], group_id: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def group_id(self) -> int:
        ...
    @property
    def ranks(self) -> list[int]:
        ...
class PreparedCollective:
    """
    A call prepared once (Communicator.prepare): run() repeats it on the same buffers.
    """
    def run(self) -> None:
        """
        Runs the call now on this thread (after any queued async work); GIL released.
        """
    @property
    def algorithm(self) -> str:
        ...
class Communicator:
    def __init__(self, *, rank: typing.SupportsInt | typing.SupportsIndex, size: typing.SupportsInt | typing.SupportsIndex, links: collections.abc.Sequence[Link], host_of: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], timeout: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    def abort(self, reason: str) -> None:
        """
        Fails every pending and future collective; peers stop waiting.
        """
    def connect_host_segment(self, *, name: str, ranks: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], digest: bytes, slot_bytes: typing.SupportsInt | typing.SupportsIndex, timeout: typing.SupportsFloat | typing.SupportsIndex) -> None:
        """
        Creates (lowest rank) or opens the shared-memory segment of this host's ranks (`ranks`, ascending, this rank among them) and keeps it for small collectives of exactly those ranks (algo "slots"); blocks until every one attached.
        """
    def exchange(self, spec: CallSpec, members: Members, *, sends: collections.abc.Sequence[typing.Any], recvs: collections.abc.Sequence[typing.Any], asynchronous: bool) -> typing.Any:
        """
        A pairwise exchange (alltoall, gather, scatter, send/recv): sends[p] (a contiguous array or None) goes to group rank p, recvs[p] receives from it. The spec's `count` is the element count every rank's header carries (the same on all ranks); its algo is ignored. Returns Work if asynchronous, else None once done.
        """
    def explain(self, spec: CallSpec, members: Members) -> str:
        """
        What algo="auto" would run for this call in the group `members`.
        """
    def fix_host_segment_distance(self, ns: typing.SupportsFloat | typing.SupportsIndex) -> None:
        """
        For tests: this rank's host segment stops timing its waits and takes `ns` for how far the other ranks' cores are (over 80 ns: far, and every member writes what the others read past the cache). Call it between collectives; no-op without a segment.
        """
    def prepare(self, spec: CallSpec, members: Members, inp: typing.Any, out: typing.Any) -> PreparedCollective:
        """
        Checks the call and settles its algorithm (where auto measures calls of its shape, its runs go on measuring, as plain calls do); the caller keeps inp and out alive while the PreparedCollective is used.
        """
    def prepare_mapped(self, spec: CallSpec, members: Members, inp: typing.Any, out: typing.Any, peer_in: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], peer_out: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], key: typing.SupportsInt | typing.SupportsIndex) -> PreparedCollective:
        """
        An allreduce prepared on buffers every group rank mapped: peer_in/peer_out hold each group rank's input and output at this process's addresses (its own among them), key is the plan's, the same on every rank. The caller keeps every mapping alive while the PreparedCollective is used.
        """
    def run(self, spec: CallSpec, members: Members, inp: typing.Any, out: typing.Any) -> None:
        """
        Runs a collective now on this thread (after any queued async work); GIL released.
        """
    def set_costs(self, local: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex], remote: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex]) -> None:
        """
        (alpha s/message, beta s/byte, gamma s/byte reduced) for same-host links (between processes: both sides copy) and cross-host links
        """
    def set_tuned(self, table: collections.abc.Sequence[tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex, str]]) -> None:
        """
        [(collective kind, max bytes, algorithm)] sorted by max bytes
        """
    def submit(self, spec: CallSpec, members: Members, inp: typing.Any, out: typing.Any) -> Work:
        """
        Queues a collective on the group's executor (issue order is run order); returns Work.
        """
    @property
    def abort_reason(self) -> str:
        ...
    @property
    def aborted(self) -> bool:
        ...
    @property
    def auto_trial_calls(self) -> int:
        """
        The most calls of one shape algo="auto" spends on its first trial where it measures (each candidate's first calls, which do not count, included); 0 where it does not (PYCOLLECTIVE_AUTO_TRIALS=0).
        """
    @property
    def host_segment(self) -> typing.Any:
        """
        (name, ranks, slot bytes) of the host segment, or None.
        """
    @property
    def host_segment_calls(self) -> int:
        """
        Calls this rank made on its host segment so far (0 without one).
        """
    @property
    def host_segment_reads_peers(self) -> typing.Any:
        """
        Whether the host segment's members read each other's buffers directly, as they agreed when they connected (PYCOLLECTIVE_CROSS_MEMORY); None without a segment.
        """
    @property
    def host_segment_streams(self) -> typing.Any:
        """
        Whether the host segment's members now write what the others read past the cache (a member finds the others' cores far); None without a segment.
        """
    @property
    def rank(self) -> int:
        ...
    @property
    def size(self) -> int:
        ...
class PreparedCallBase:
    """
    Runs a PreparedCollective and returns its result (pycollective.PreparedCall derives from it).
    """
    def __call__(self) -> typing.Any:
        """
        Runs the call now on this thread (after any queued async work; GIL released) and returns its result.
        """
    def __init__(self, prepared: typing.Any, result: typing.Any, explain: typing.Any) -> None:
        ...
class KnownLayouts:
    """
    The array layouts one combination of a group's call arguments was checked with (pycollective/_call_memo.py).
    """
    def __init__(self, members: Members) -> None:
        ...
    def __len__(self) -> int:
        ...
    def remember(self, x: numpy.ndarray, out: typing.Any, writes: str, spec: CallSpec, result: typing.Any) -> None:
        """
        Keeps the layout of a call that passed every check.
        """
    def run(self, comm: Communicator, x: typing.Any, out: typing.Any) -> typing.Any:
        """
        Runs the call if (x, out) has a known layout and returns its result; else NotImplemented. GIL released while it runs.
        """
class NcclComm:
    @staticmethod
    def init_all(devices: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], timeout: typing.SupportsFloat | typing.SupportsIndex) -> list:
        ...
    def __init__(self, *, nranks: typing.SupportsInt | typing.SupportsIndex, unique_id: bytes, rank: typing.SupportsInt | typing.SupportsIndex, device: typing.SupportsInt | typing.SupportsIndex, timeout: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def abort(self, reason: str) -> None:
        ...
    def allgather(self, send: typing.SupportsInt | typing.SupportsIndex, recv: typing.SupportsInt | typing.SupportsIndex, send_count: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def allreduce(self, send: typing.SupportsInt | typing.SupportsIndex, recv: typing.SupportsInt | typing.SupportsIndex, count: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, op: typing.SupportsInt | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def async_error(self) -> str:
        ...
    def broadcast(self, send: typing.SupportsInt | typing.SupportsIndex, recv: typing.SupportsInt | typing.SupportsIndex, count: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, root: typing.SupportsInt | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def is_completed(self) -> bool:
        ...
    def reduce(self, send: typing.SupportsInt | typing.SupportsIndex, recv: typing.SupportsInt | typing.SupportsIndex, count: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, op: typing.SupportsInt | typing.SupportsIndex, root: typing.SupportsInt | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def reduce_scatter(self, send: typing.SupportsInt | typing.SupportsIndex, recv: typing.SupportsInt | typing.SupportsIndex, recv_count: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, op: typing.SupportsInt | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def synchronize(self, timeout: typing.SupportsFloat | typing.SupportsIndex) -> bool:
        ...
    @property
    def aborted(self) -> bool:
        ...
    @property
    def device(self) -> int:
        ...
    @property
    def failure(self) -> str:
        ...
    @property
    def rank(self) -> int:
        ...
    @property
    def size(self) -> int:
        ...
    @property
    def timeout(self) -> float:
        ...
    @timeout.setter
    def timeout(self, arg1: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
def algorithms() -> list[str]:
    ...
def allreduce_update(*, comm: Communicator, rule: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, hyper: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex], tensors: collections.abc.Sequence[tuple[typing.SupportsInt | typing.SupportsIndex, list, list, collections.abc.Sequence[list]]], shape_hashes: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], timeout: typing.SupportsFloat | typing.SupportsIndex, members: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], group_id: typing.SupportsInt | typing.SupportsIndex, sharded_slots: bool = False) -> None:
    """
    Optimizer steps across a process group, each fused into the all-reduce of its gradient (optim/allreduce_update.h), all tensors as one pipelined ring; tensors = [(count, [this rank's gradient], copies, [slot copies, ...])]. sharded_slots: each slot is [this rank's chunk] (ZeRO-1) and only the variable is allgathered. Runs after any queued async work; GIL released.
    """
def apply_replicated_update(*, rule: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, hyper: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex], tensors: collections.abc.Sequence[tuple[typing.SupportsInt | typing.SupportsIndex, list, list, collections.abc.Sequence[list]]]) -> None:
    """
    Fused reduce-and-update of replicated optimizer state. hyper = (lr, momentum, beta_1, beta_2, epsilon, grad_scale); tensors = [(count, grads, copies, [slot copies, ...])]. GIL released.
    """
def bridge_link(rank: typing.SupportsInt | typing.SupportsIndex, peer: typing.SupportsInt | typing.SupportsIndex, via: str) -> tuple[Link, BridgeEnd]:
    """
    A link whose frames a pump carries: returns (link, end).
    """
def build_info() -> dict:
    ...
def cache_line_round_trip_ns(cpu_a: typing.SupportsInt | typing.SupportsIndex, cpu_b: typing.SupportsInt | typing.SupportsIndex, rounds: typing.SupportsInt | typing.SupportsIndex = 2000, batches: typing.SupportsInt | typing.SupportsIndex = 9) -> float:
    """
    Nanoseconds a cache line takes from CPU cpu_a to cpu_b and back (median of `batches` batches of `rounds`); -1 if a thread cannot run on either CPU, or both are one.
    """
def cache_resident_bytes() -> int:
    """
    Bytes a call may read and write in all and still count as in cache for in-process auto (PYCOLLECTIVE_CACHE_BYTES, else measured once per process).
    """
def cuda_copy(dst: typing.SupportsInt | typing.SupportsIndex, src: typing.SupportsInt | typing.SupportsIndex, bytes: typing.SupportsInt | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
    ...
def cuda_describe() -> str:
    ...
def cuda_device_count() -> int:
    ...
def cuda_free(ptr: typing.SupportsInt | typing.SupportsIndex, device: typing.SupportsInt | typing.SupportsIndex) -> None:
    ...
def cuda_malloc(bytes: typing.SupportsInt | typing.SupportsIndex, device: typing.SupportsInt | typing.SupportsIndex) -> int:
    ...
def cuda_pointer_device(ptr: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    CUDA device holding the memory at ptr, or -1 for host memory.
    """
def cuda_reduce(dst: typing.SupportsInt | typing.SupportsIndex, a: typing.SupportsInt | typing.SupportsIndex, b: typing.SupportsInt | typing.SupportsIndex, count: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, op: typing.SupportsInt | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
    """
    Enqueues dst = a OP b on the stream (avg enqueues the sum); returns at once.
    """
def cuda_scale(data: typing.SupportsInt | typing.SupportsIndex, count: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, factor: typing.SupportsFloat | typing.SupportsIndex, stream: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
    ...
def cuda_synchronize(stream: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
    ...
def data_cipher_library() -> str:
    """
    The libcrypto that encrypted tcp links use (loaded on first use); raises when none can be loaded.
    """
def enum_codes() -> dict:
    ...
def knob_table() -> list:
    ...
def line_from_passes(reference_rate: typing.SupportsFloat | typing.SupportsIndex, pass_rates: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], reported_bytes: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    The in-cache line from the probe's pass rates (working sets of 1 MiB << i), the faster of a 32 and a 64 MiB pass, and the cache size the OS reports.
    """
def line_with_reported_cache(measured_line: typing.SupportsInt | typing.SupportsIndex, reported_bytes: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    The in-cache line from the probe's measured line and the cache size the OS reports.
    """
def memory_bandwidth(bytes_per_thread: typing.SupportsInt | typing.SupportsIndex, threads: typing.SupportsInt | typing.SupportsIndex, reps: typing.SupportsInt | typing.SupportsIndex = 3) -> float:
    """
    Bytes read+written per second when `threads` threads each copy a private buffer.
    """
def model_estimates(host_of: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], local: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex], remote: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex], spec: CallSpec, cores: typing.SupportsInt | typing.SupportsIndex = -1) -> tuple[list, str]:
    """
    The cost model alone, no group formed: for ranks on hosts host_of[r] with these (alpha, beta, gamma) link costs (remote beta: one host's link, shared by its ranks) and `cores` per host (-1: this host's; 0: a core for every rank), returns ([(algorithm, seconds or None, why not)], auto's pick).
    """
def nccl_available() -> bool:
    ...
def nccl_group_end() -> None:
    ...
def nccl_group_start() -> None:
    ...
def nccl_library() -> dict:
    """
    Loads the process's NCCL (first call) and describes it; raises NcclUnavailable.
    """
def nccl_probe(wheel_dirs: collections.abc.Sequence[tuple[str, str]]) -> dict:
    """
    Tries the search order once without keeping the library; raises NcclUnavailable.
    """
def nccl_search_order(wheel_dirs: collections.abc.Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """
    The (path, origin) candidates, in the order they are tried.
    """
def nccl_set_wheel_dirs(dirs: collections.abc.Sequence[tuple[str, str]]) -> None:
    """
    (folder, origin) pairs of installed nvidia-nccl-cu* wheels.
    """
def nccl_unique_id() -> bytes:
    ...
def new_result(dtype: numpy.dtype[typing.Any], shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> numpy.ndarray:
    """
    A new C-contiguous result array; from POOLED_OUTPUT_BYTES up its memory comes from the output pool and returns there when the array goes.
    """
def output_pool_cached_bytes() -> int:
    """
    Bytes of released result memory kept for reuse.
    """
def parse_cache_size(text: str) -> int:
    """
    A cache size as /sys writes it ('32768K') in bytes; 0 for text it cannot read.
    """
def reduce_into(dst: typing.SupportsInt | typing.SupportsIndex, a: typing.SupportsInt | typing.SupportsIndex, b: typing.SupportsInt | typing.SupportsIndex, count: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, op: typing.SupportsInt | typing.SupportsIndex) -> None:
    ...
def reload_knobs() -> None:
    """
    Reads the PYCOLLECTIVE_* variables again (native side); config.reload() calls it.
    """
def round_to_wire(array: typing.Any, count: typing.SupportsInt | typing.SupportsIndex, wire: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    Rounds `count` float32 values of a contiguous numpy array in place to what a compressed call sends for them (wire: 1 bf16, 2 fp16): the kernel the collectives use.
    """
def scale(data: typing.SupportsInt | typing.SupportsIndex, count: typing.SupportsInt | typing.SupportsIndex, dtype: typing.SupportsInt | typing.SupportsIndex, factor: typing.SupportsFloat | typing.SupportsIndex) -> None:
    ...
def set_log_rank(rank: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    This process's rank, for the prefix of native log lines (pycollective/log.py).
    """
def shm_link(*, name: str, create: bool, rank: typing.SupportsInt | typing.SupportsIndex, peer: typing.SupportsInt | typing.SupportsIndex, digest: bytes, ring_bytes: typing.SupportsInt | typing.SupportsIndex, timeout: typing.SupportsFloat | typing.SupportsIndex) -> Link:
    """
    Creates (lower rank) or opens a shared-memory segment; blocks until both sides attached.
    """
def tcp_link(*, fd: typing.SupportsInt | typing.SupportsIndex, rank: typing.SupportsInt | typing.SupportsIndex, peer: typing.SupportsInt | typing.SupportsIndex, address: str, key: bytes = b'') -> Link:
    """
    Takes over a connected, authenticated socket (the link closes it). With a 32-byte key, every byte travels in AES-256-GCM records (both ends need the same key).
    """
PARKED_PEER_SECONDS: float = 6e-06
POOLED_OUTPUT_BYTES: int = 1048576
