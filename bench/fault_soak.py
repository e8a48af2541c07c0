"""The fault soak: hurt running jobs many times and fuzz both planes, then report the figures of
docs/reliability.md. Not a test (it runs for many minutes); tests/test_fault_suite.py runs a
short version of each part in CI.

    pycollective bench-faults                 # 100 kill rounds, 20 stop rounds,
                                                            # 100,000 control-plane inputs
    pycollective bench-faults --kill-rounds 10 --stop-rounds 4 --fuzz-inputs 2000
    pycollective bench-faults --native-fuzz build/ctest/tests/native/test_tcp

Parts:

- kill rounds: 3 or 4 ranks loop random collectives (collective, size, dtype, algorithm; the
  transport of the round: tcp, shm, grpc, or tcp with encrypted links); one random rank is
  SIGKILLed at a random moment. Every other rank must raise within 10 s, naming the dead rank;
  no result may differ from numpy; no rank may hang or crash.
- stop rounds: one rank is SIGSTOPped, then SIGCONTinued, either well within the heartbeat
  timeout (the job must go on, all results right) or past it (the others must raise within
  10 s of the stop, naming the frozen rank).
- control-plane fuzz (bench/fault_fuzz.py): malformed, truncated, oversized and replayed
  requests, with and without the token; none without it may be accepted or change the group.
- network rounds (bench/fault_network.py; root): a host cut off past the heartbeat timeout or
  for a moment; and packet loss and delay on every host's link (netem, or
  bench/impaired_link.py's relay where the kernel lacks it).
- data-plane fuzz: the native fuzzer of tcp frames and encrypted records
  (tests/native/test_tcp.cc), when ``--native-fuzz`` names its binary (an ASan build:
  .ci/native_tests.sh), with ``--fuzz-inputs`` frames.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time

from pycollective import config

from . import fault_network
from .fault_fuzz import fuzz_control_plane
from .fault_ranks import TRANSPORTS, finish, hurt, start_job

# Every survivor must have raised within this many seconds of the fault.
DETECT_WITHIN_S = 10.0
# A round whose ranks are still running this long after the fault hangs.
HANG_AFTER_S = 40.0
HEARTBEAT_TIMEOUT_S = 3.0
# Longer than DETECT_WITHIN_S: a rank frozen this long must have been reported while frozen.
STOPPED_PAST_S = 12.0


def kill_round(rng: random.Random) -> dict:
    """One SIGKILL round; returns what happened and the problems found."""
    world, transport = rng.choice((3, 4)), rng.choice(TRANSPORTS)
    victim, seed = rng.randrange(world), rng.getrandbits(32)
    job = start_job(world, transport, seed, env={"PYCOLLECTIVE_TIMEOUT": "60"})
    time.sleep(rng.uniform(0.05, 1.5))
    at = hurt(job, victim, "kill")
    reports = finish(job, timeout=HANG_AFTER_S)
    return _judge("kill", world, transport, victim, at, reports, survive=False)


def stop_round(
    rng: random.Random,
    past_timeout: bool,
    victim: int | None = None,
    heartbeat_timeout: float | None = HEARTBEAT_TIMEOUT_S,
) -> dict:
    """One SIGSTOP/SIGCONT round of ``victim`` (None: a random rank; rank 0 hosts the
    coordination service): 0.3 x the heartbeat timeout (the job must go on), or
    ``STOPPED_PAST_S`` (the others must raise within 10 s of the stop). ``heartbeat_timeout``
    None runs the ranks with the library's default (PYCOLLECTIVE_HEARTBEAT_TIMEOUT unset)."""
    world, transport = rng.choice((3, 4)), rng.choice(TRANSPORTS)
    seed = rng.getrandbits(32)
    victim = rng.randrange(world) if victim is None else victim
    env = {"PYCOLLECTIVE_TIMEOUT": "60"}
    if heartbeat_timeout is not None:
        env["PYCOLLECTIVE_HEARTBEAT_TIMEOUT"] = str(heartbeat_timeout)
    else:
        heartbeat_timeout = float(config.knob("PYCOLLECTIVE_HEARTBEAT_TIMEOUT").default)
    job = start_job(world, transport, seed, env=env)
    time.sleep(rng.uniform(0.05, 1.0))
    stopped = STOPPED_PAST_S if past_timeout else heartbeat_timeout * 0.3
    at = hurt(job, victim, "stop", stopped_s=stopped)
    # Within the timeout the job goes on: let it run a little more, then stop it cleanly.
    reports = finish(job, timeout=HANG_AFTER_S, stop_after=None if past_timeout else 1.0)
    how = "stop past the heartbeat timeout" if past_timeout else "stop within the timeout"
    return _judge(how, world, transport, victim, at, reports, survive=not past_timeout)


def _judge(
    how: str,
    world: int,
    transport: str,
    victim: int,
    at: float,
    reports: list[dict],
    survive: bool,
) -> dict:
    problems: list[str] = []
    detect: list[float] = []
    wrong = sum(r.get("wrong", 0) for r in reports)
    if wrong:
        problems.append(f"{wrong} wrong results accepted")
    for rank, r in enumerate(reports):
        if r["hung"]:
            problems.append(
                f"rank {rank} hung (killed after {HANG_AFTER_S:g} s); its last output, where "
                f"each thread waited: {r.get('output_tail', '')}"
            )
            continue
        if rank == victim and how == "kill":
            continue
        if r["exit"] != 0:
            problems.append(f"rank {rank} exited {r['exit']} (a crash?)")
        if rank == victim:
            continue
        error = r.get("error")
        if survive:
            if error is not None:
                problems.append(f"rank {rank} failed: {error['type']}: {error['message'][:300]}")
            continue
        if error is None:
            problems.append(f"rank {rank} reported no error")
            continue
        seconds = error["at"] - at
        detect.append(seconds)
        if seconds > DETECT_WITHIN_S:
            problems.append(f"rank {rank} raised {seconds:.1f} s after the fault")
        if f"rank {victim}" not in error["message"]:
            problems.append(
                f"rank {rank}'s error does not name rank {victim}: "
                f"{error['type']}: {error['message'][:300]}"
            )
    return {
        "fault": how,
        "world": world,
        "transport": transport,
        "victim": victim,
        "calls": sum(r.get("calls", 0) for r in reports),
        "detect_s": detect,
        "wrong": wrong,
        "hung": sum(bool(r["hung"]) for r in reports),
        "problems": problems,
    }


def native_fuzz(binary: str, inputs: int) -> dict:
    """Runs the native fuzzer of tcp frames (tests/native/test_tcp.cc)."""
    done = subprocess.run(
        [binary, "--iterations", str(inputs)], capture_output=True, text=True, timeout=3600
    )
    return {
        "exit": done.returncode,
        "output": done.stdout.strip().splitlines()[-3:],
        "problems": [] if done.returncode == 0 else [done.stdout[-2000:] + done.stderr[-2000:]],
    }


def summarize(rounds: list[dict]) -> dict:
    detect = sorted(s for r in rounds for s in r["detect_s"])
    return {
        "rounds": len(rounds),
        "collectives completed": sum(r["calls"] for r in rounds),
        "hangs": sum(r["hung"] for r in rounds),
        "wrong results accepted": sum(r["wrong"] for r in rounds),
        "survivor errors": len(detect),
        "detection s (median, max)": (
            [round(detect[len(detect) // 2], 2), round(detect[-1], 2)] if detect else None
        ),
        "rounds with problems": sum(bool(r["problems"]) for r in rounds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kill-rounds", type=int, default=100)
    parser.add_argument("--stop-rounds", type=int, default=20)
    parser.add_argument(
        "--network-rounds",
        type=int,
        default=10,
        help="partition rounds (half short, half past the timeout); root only, skipped with "
        "the reason elsewhere",
    )
    parser.add_argument(
        "--loss-rounds",
        type=int,
        default=3,
        help="rounds with 2%% packet loss and 20 ms delay on every host's link (netem, or a "
        "user-space relay where the kernel lacks it); root only, like --network-rounds",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=HEARTBEAT_TIMEOUT_S,
        help="PYCOLLECTIVE_HEARTBEAT_TIMEOUT of the stop rounds' ranks; 0: the library's "
        "default (unset)",
    )
    parser.add_argument("--fuzz-inputs", type=int, default=100_000)
    parser.add_argument("--native-fuzz", metavar="TEST_TCP", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", default=None)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    result: dict = {}
    kills = []
    for i in range(args.kill_rounds):
        kills.append(kill_round(rng))
        print(f"kill {i + 1}/{args.kill_rounds}: {json.dumps(kills[-1])}", flush=True)
    stops = []
    for i in range(args.stop_rounds):
        stops.append(
            stop_round(
                rng, past_timeout=i % 2 == 1, heartbeat_timeout=args.heartbeat_timeout or None
            )
        )
        print(f"stop {i + 1}/{args.stop_rounds}: {json.dumps(stops[-1])}", flush=True)
    network: list[dict] = []
    losses: list[dict] = []
    why_not = fault_network.skip_reason()
    if (args.network_rounds or args.loss_rounds) and why_not:
        result["network"] = {"skipped": why_not}
    else:
        for i in range(args.network_rounds):
            network.append(fault_network.partition_round(rng, past_timeout=i % 2 == 1))
            print(f"network {i + 1}/{args.network_rounds}: {json.dumps(network[-1])}", flush=True)
        for i in range(args.loss_rounds):
            losses.append(fault_network.loss_delay_round(rng))
            print(f"loss/delay {i + 1}/{args.loss_rounds}: {json.dumps(losses[-1])}", flush=True)
        if network:
            result["network"] = summarize(network)
        if losses and "skipped" in losses[0]:
            result["loss/delay"] = {"skipped": losses[0]["skipped"]}
            losses = []
        elif losses:
            result["loss/delay"] = summarize(losses)
            result["loss/delay"]["by"] = losses[0]["by"]
        network += losses
    result["kill"] = summarize(kills)
    result["stop"] = summarize(stops)
    if args.fuzz_inputs:
        fuzz = fuzz_control_plane(args.fuzz_inputs, seed=args.seed)
        result["control-plane fuzz"] = fuzz
        if args.native_fuzz:
            result["data-plane fuzz"] = native_fuzz(args.native_fuzz, args.fuzz_inputs)
    problems = [p for r in kills + stops + network for p in r["problems"]]
    problems += result.get("control-plane fuzz", {}).get("violations", [])
    problems += result.get("data-plane fuzz", {}).get("problems", [])
    result["problems"] = problems
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"summary": result, "kill": kills, "stop": stops, "network": network}, f, indent=1
            )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
