"""Command line of the benchmark: ``pycollective bench`` / ``python -m bench``.

Options follow nccl-tests: -b/-e/-f size sweep, -c collective, -d dtype, -o op, -n iterations,
-w warm-up. Every row's result is checked; a wrong result is shown and makes the exit code 1.
By default local processes run every algorithm over shared memory, with torch.distributed
(gloo) and MPI in the same run where installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from .metrics import human_bytes, parse_size
from .report import plot, summary, table, write_csv, write_json

COLLECTIVES = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"]
# Algorithms that need every replica in this process (LocalCommunicator): not run across procs.
IN_PROCESS_ONLY = ("direct", "inline")
# Algorithms of processes sharing a host segment: not run on in-process replicas.
PROCESSES_ONLY = ("slots", "staged")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="pycollective bench", description=__doc__)
    p.add_argument(
        "--mode",
        choices=["procs", "inproc"],
        default="procs",
        help="procs: one process per rank (default); inproc: replicas are threads "
        "of one process (LocalCommunicator)",
    )
    p.add_argument("-c", "--collective", choices=COLLECTIVES, default="allreduce")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("4K"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument(
        "-d",
        "--dtype",
        default="float32",
        choices=["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"],
    )
    p.add_argument("-o", "--op", default="sum", choices=["sum", "prod", "min", "max", "avg"])
    p.add_argument("-n", "--iters", type=int, default=100)
    p.add_argument("-w", "--warmup", type=int, default=3)
    p.add_argument(
        "--world",
        type=int,
        default=None,
        help="replicas (inproc, default 4) or processes (procs, default: cores, 2..4)",
    )
    p.add_argument(
        "--algos",
        default=None,
        help="comma-separated algorithms (default: all that the mode can run, and in procs "
        "mode for allreduce 'prepared': pycollective.prepare_allreduce, auto's choice made "
        "once, and 'shared': the same on pycollective.shared_empty arrays)",
    )
    p.add_argument(
        "--transports",
        default="shm",
        help="procs mode: comma-separated transports among shm, tcp, grpc, and auto (each "
        "peer's own: shm on its host, tcp across hosts, as with --hosts)",
    )
    p.add_argument(
        "--peers",
        default="gloo,mpi,tensorflow",
        help="procs mode: libraries measured in the same run ('' for none)",
    )
    p.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="procs mode: pretend the ranks sit on this many hosts (consecutive "
        "ranks per host), to exercise hierarchical on one machine",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="procs mode: run ours and the peers this many times, alternating, and report the "
        "median of the rounds (fair ratios on a machine whose load drifts)",
    )
    p.add_argument(
        "--mpi-in-job",
        action="store_true",
        help="procs mode: time Open MPI's Allreduce in our shm ranks (mpirun starts them), "
        "interleaved with ours, each after its own barrier, instead of in a launch of its own",
    )
    p.add_argument("--inplace", action="store_true", help="in place instead of out= buffers")
    p.add_argument(
        "--new-outputs",
        action="store_true",
        help="every call returns new result arrays (y = allreduce(x)) instead of writing into "
        "out= buffers (peers keep theirs)",
    )
    p.add_argument(
        "--new-outputs-row",
        action="store_true",
        help="allreduce: add the row auto+new, auto's call returning new result arrays "
        "(y = allreduce(x)) in a group of its own, timed in the same rounds as the out= rows "
        "(auto's row too, if --algos leaves it out): what a new output costs, as a ratio from "
        "one run",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.5,
        help="seconds of timing per row at most (at least 3 iterations)",
    )
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--csv", metavar="FILE")
    p.add_argument("--plot", metavar="FILE.png")
    return p


def sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    if minbytes <= 0 or maxbytes < minbytes or factor < 2:
        raise SystemExit("need 0 < -b <= -e and -f >= 2")
    out, s = [], minbytes
    while s <= maxbytes:
        out.append(s)
        s *= factor
    return out


class Progress:
    """One status line on a terminal; nothing but the final table when piped."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.tty = total, 0, sys.stderr.isatty()
        self.start = time.time()
        # "skip <algo> ...: why" lines, the first for each row name: a row missing from the
        # table says why under its header instead of silently.
        self.skipped: dict[str, str] = {}

    def __call__(self, text: str) -> None:
        if text.startswith("skip"):
            name = text.split()[1] if len(text.split()) > 1 else ""
            self.skipped.setdefault(name.rstrip(":"), text)
            return
        self.done += 1
        if self.tty:
            sys.stderr.write(
                f"\r[{self.done}/{self.total} {time.time() - self.start:5.1f}s] {text:<60}"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\r" + " " * 90 + "\r")


HELP = "benchmark collectives: every algorithm, transport and peer side by side"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    build_parser(parser)


def _command_line() -> str:
    """This process's command line as a user would type it (for the figure's footer)."""
    import shlex

    words = [shlex.quote(a) for a in sys.argv[1:]]
    if os.path.basename(sys.argv[0]) == "pycollective":
        return " ".join(["pycollective", *words])
    return " ".join([os.path.basename(sys.executable), shlex.quote(sys.argv[0]), *words])


# What is measured at the start of every round: label, unit, scale.
_PER_ROUND = {
    "cache_line_round_trip_ns": ("a cache line from CPU {a} to CPU {b} and back", "ns", 1.0),
    "loopback_tcp_Bps": ("loopback TCP, one stream", "GB/s", 1e-9),
    "loopback_tcp_span_Bps": (
        "loopback TCP, one stream from and into {span} buffers",
        "GB/s",
        1e-9,
    ),
    "loopback_tcp_exchange_Bps": (
        "loopback TCP, two endpoints sending and receiving at once",
        "GB/s each way",
        1e-9,
    ),
}


def per_round_lines(
    samples: dict[str, list[float]], cpus: tuple[int, int] = (0, 1), span: int = 0
) -> list[str]:
    """The header lines of what each round measured: the median of the rounds, and their range
    (`span`: the buffers of the large-buffer TCP stream)."""
    lines = []
    for name, values in samples.items():
        label, unit, scale = _PER_ROUND[name]
        kind = "machine" if name == "cache_line_round_trip_ns" else "ceiling"
        digits = 0 if scale == 1.0 else 2
        text = (
            f"# {kind}: {label.format(a=cpus[0], b=cpus[1], span=human_bytes(span))}: "
            f"{statistics.median(values) * scale:.{digits}f} {unit}"
        )
        if len(values) > 1:
            text += (
                f" (median of {len(values)} rounds, "
                f"{min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"
            )
        lines.append(text)
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    import pycollective as pc

    from . import ceilings as measure
    from . import inproc, procs
    from .worker import AUTO_ROWS, PREPARED, SHARED

    procs_mode = args.mode == "procs"
    world = args.world or (max(2, min(4, os.cpu_count() or 2)) if procs_mode else 4)
    everything = [
        a for a in pc.algorithms() if a not in (IN_PROCESS_ONLY if procs_mode else PROCESSES_ONLY)
    ]
    if procs_mode and args.collective == "allreduce":
        everything += [PREPARED, SHARED]  # pc.prepare_allreduce: auto, checked once
    algos = [a for a in (args.algos or ",".join(everything)).split(",") if a]
    unknown = set(algos) - set(everything)
    if unknown:
        raise SystemExit(f"unknown algorithms {sorted(unknown)}; choose from {everything}")
    if args.new_outputs_row:
        if args.new_outputs or args.inplace or args.collective != "allreduce":
            raise SystemExit(
                "--new-outputs-row sets allreduce's new outputs beside its out= rows: "
                "drop --new-outputs and --inplace, and keep --collective allreduce"
            )
        # The row, and auto's own row that it is set beside.
        algos += [a for a in AUTO_ROWS if a not in algos]
    transports = [t for t in args.transports.split(",") if t]
    peers = [p for p in args.peers.split(",") if p] if procs_mode else []
    if procs_mode and world % args.hosts:
        raise SystemExit(f"--hosts {args.hosts} must divide the number of ranks ({world})")
    if args.mpi_in_job and args.hosts > 1:
        raise SystemExit(
            "--mpi-in-job runs the ranks under mpirun, which cannot give them "
            "pretend hosts: drop --hosts or --mpi-in-job"
        )
    sweep = sizes(args.minbytes, args.maxbytes, args.stepfactor)
    info = pc.build_info()

    copy_bw = measure.memory_copy_bandwidth(min(args.maxbytes, 64 << 20), world)
    ceilings = {"memory_copy_Bps": copy_bw}
    # The TCP ceilings, and how far apart two CPUs are, are measured at the start of every
    # round, beside the rows they bound: on the 2-vCPU VM one loopback stream moved 1.8-5.0 GB/s
    # between rounds of one run, and a cache line between the vCPUs took 50 or 340 ns as the
    # hypervisor placed them (docs/benchmarks-log.md, "Two vCPUs that drift apart"); measured once,
    # they would describe another moment than the rows.
    per_round: dict[str, list[float]] = {}
    wants_tcp = procs_mode and ("tcp" in transports or "gloo" in peers)
    # One stream from and into buffers of the largest message, where those leave the cache
    # (past the probes' 4 MiB chunks): what one tcp link carries for such a call.
    tcp_span = min(sweep[-1], 256 << 20) if sweep[-1] > (4 << 20) else 0
    if wants_tcp and tcp_span:
        ceilings["loopback_tcp_span_bytes"] = tcp_span
    cpu_pair = measure.two_cpus()

    def measure_round() -> None:
        if cpu_pair is not None:
            ns = measure.cache_line_round_trip_ns(*cpu_pair)
            if ns is not None:
                per_round.setdefault("cache_line_round_trip_ns", []).append(ns)
        if wants_tcp:
            for name, probe in (
                ("loopback_tcp_Bps", measure.loopback_tcp_bandwidth),
                ("loopback_tcp_exchange_Bps", measure.loopback_tcp_exchange_bandwidth),
            ):
                per_round.setdefault(name, []).append(probe())
            if tcp_span:
                span_Bps = measure.loopback_tcp_bandwidth(span=tcp_span)
                per_round.setdefault("loopback_tcp_span_Bps", []).append(span_Bps)

    where = (
        f"{world} processes over {','.join(transports)}"
        if procs_mode
        else f"{world} in-process replicas"
    )
    print(
        f"# pycollective {info['version']} bench: {args.collective}, {where}, {args.dtype} "
        f"{args.op}, {human_bytes(sweep[0])}..{human_bytes(sweep[-1])}, kernels {info['simd']}"
    )
    print(
        f"# ceiling: memory copy bandwidth, {world} threads: {copy_bw / 1e9:.1f} GB/s (read+write)"
    )
    notes: list[str] = []
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    rounds = args.rounds if procs_mode else 1
    total = len(sweep) * (len(algos) * (len(transports) if procs_mode else 1) + len(peers)) * rounds
    progress = Progress(total)
    if procs_mode:
        host_ids = (
            [f"host{r * args.hosts // world}" for r in range(world)] if args.hosts > 1 else None
        )
        rows = procs.run(
            args.collective,
            sweep,
            args.dtype,
            args.op,
            world,
            algos,
            transports,
            peers,
            args.iters,
            args.warmup,
            args.budget,
            progress,
            notes,
            host_ids,
            new_outputs=args.new_outputs,
            new_outputs_row=args.new_outputs_row,
            rounds=rounds,
            mpi_in_job=args.mpi_in_job,
            before_round=measure_round,
        )
    else:
        measure_round()  # one round in process
        # The line in-process auto's model prices by (measured once per process, from the
        # caches; core/cache_probe.h): where it lands moves choices from 1 MiB up, so a run
        # says where it landed.
        ceilings["cache_resident_bytes"] = pc._C.cache_resident_bytes()
        rows = inproc.run(
            args.collective,
            sweep,
            args.dtype,
            args.op,
            world,
            algos,
            args.iters,
            args.warmup,
            args.inplace,
            copy_bw,
            progress,
            args.budget,
            new_outputs=args.new_outputs,
        )
    progress.close()
    notes.extend(progress.skipped.values())
    for name, samples in per_round.items():
        ceilings[name] = statistics.median(samples)
    for line in per_round_lines(per_round, cpu_pair or (0, 1), tcp_span):
        print(line)
    if "cache_resident_bytes" in ceilings:
        print(
            f"# machine: in-process calls of up to "
            f"{human_bytes(int(ceilings['cache_resident_bytes']))} of traffic count as in cache "
            "(this process's cache probe; PYCOLLECTIVE_CACHE_BYTES sets it)"
        )
    for note in notes:
        print(f"# {note}")
    table(rows, sys.stdout)
    print()
    for line in summary(rows, ceilings):
        print(line)
    if args.json:
        write_json(rows, ceilings, args.json)
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot:
        plot(rows, ceilings, args.plot, command=_command_line())
    return 1 if any(r.wrong for r in rows) else 0
