"""What encrypting the tcp data links costs: one all-reduce size over tcp, plaintext links
against AES-256-GCM links (PYCOLLECTIVE_DATA_ENCRYPT=1), in interleaved rounds, medians.

    pycollective bench-encrypt --world 3 --size 64M --rounds 5

Each round starts one job per mode (`pycollective run`, every rank on this host over tcp); each
job checks its result against numpy, then times ``--iters`` all-reduces after a warm-up and
reports the slowest rank's median. The two modes alternate round by round, so a machine that
gets busier part-way slows both alike; the report is the median over rounds and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from pycollective._spawn import child_environment, python_module_command

from .metrics import human_bytes, parse_size

MODES = {"plaintext": "0", "AES-256-GCM": "1"}

# Runs in every rank of a job: prints the slowest rank's median seconds per call as JSON.
_RANK_PROGRAM = """
import json, sys, time
import numpy as np
import pycollective as pc

count, iters, algo = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
pc.init(transport="tcp")
x = np.full(count, pc.rank() + 1, np.float32)
out = np.empty_like(x)
pc.allreduce(x, algo=algo, out=out)
n = pc.world_size()
assert np.all(out == n * (n + 1) / 2), "wrong all-reduce result"
times = []
for _ in range(iters):
    pc.barrier()
    start = time.perf_counter()
    pc.allreduce(x, algo=algo, out=out)
    times.append(time.perf_counter() - start)
slowest = pc.allreduce(np.array([float(np.median(times))]), op="max")[0]
if pc.rank() == 0:
    print("RESULT", json.dumps({"median_s": float(slowest)}), flush=True)
pc.shutdown()
"""


def run_job(world: int, count: int, iters: int, algo: str, encrypt: str, timeout: float) -> float:
    """One job of ``world`` ranks; the slowest rank's median seconds per all-reduce."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_RANK_PROGRAM)
        program = f.name
    env = child_environment(dict(os.environ, PYCOLLECTIVE_DATA_ENCRYPT=encrypt))
    try:
        done = subprocess.run(
            python_module_command(
                "pycollective.cli",
                "run",
                "-n",
                str(world),
                "--timeout",
                str(timeout),
                "--no-tag-output",
                sys.executable,
                program,
                str(count),
                str(iters),
                algo,
            ),
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout + 30,
        )
    finally:
        os.unlink(program)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return float(json.loads(line[7:])["median_s"])
    raise RuntimeError(f"the job failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--size", type=parse_size, default=64 << 20, help="bytes (64M)")
    parser.add_argument("--algo", default="ring")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    args = parser.parse_args(argv)
    count = args.size // 4
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for r in range(args.rounds):
        for mode, flag in MODES.items():
            t = run_job(args.world, count, args.iters, args.algo, flag, args.timeout)
            seconds[mode].append(t)
            print(f"round {r + 1}: {mode}: {t * 1e3:.1f} ms", flush=True)
    medians = {mode: statistics.median(ts) for mode, ts in seconds.items()}
    size = human_bytes(count * 4)
    print(
        f"\n{size} float32 all-reduce ({args.algo}), {args.world} ranks over tcp, "
        f"{args.rounds} interleaved rounds of {args.iters} calls (medians):"
    )
    for mode, t in medians.items():
        busbw = 2 * (args.world - 1) / args.world * count * 4 / t / 1e9
        print(f"  {mode:12s} {t * 1e3:8.1f} ms   busbw {busbw:6.2f} GB/s")
    print(f"  encrypted / plaintext time: {medians['AES-256-GCM'] / medians['plaintext']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
