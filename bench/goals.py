"""``pycollective bench-goals``: the project's speed goals on one host, each measured as ratios
within single ``pycollective bench`` runs (peers in the same run), with a verdict per goal.

  1  small messages: 2 and 4 ranks over shm, 8 B-16 KiB, our fastest call on the caller's own
     buffers (plain or prepared) at least as fast as Open MPI's Allreduce (mpi4py, timed in
     the same ranks, interleaved: --mpi-in-job)
  2  every size from 16 KiB to 256 MiB, 2 and 4 ranks over shm: the same
  3  tcp, 2 ranks x 64 MiB: auto at least 0.6x one loopback TCP stream and 2x gloo
  4  auto never a trap: sweeps of 8 B-64 MiB, processes 2-4 and in-process replicas 2-8, with
     out= and with new outputs; a cell counts against auto when it ran over 1.15x the fastest
     algorithm in the sweep's pass *and* in its second, head-to-head look
  5  new outputs cheap: y = allreduce(x) within 1.3x of the call with out= at 64 MiB (processes
     2 and 4, in process 2, 4 and 8)
  6  no regression at 64 MiB: 2 ranks over shm at least 2.8x Open MPI and 3x gloo; the
     MirroredStrategy step of `pycollective bench-strategies` at most 1.05x the bare all-reduce

Every run's table and JSON are kept in --out. PYCOLLECTIVE_TUNING, when set, applies to every
run (goal 4 "after `pycollective tune`"). All goals take about 13 minutes on 2 cores; --goals
picks some. A goal whose peer is not installed is reported as not measured, with the reason.
Exit status 1 when a measured goal is not met, else 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from pycollective import config
from pycollective._spawn import child_environment, python_module_command

from .metrics import human_bytes
from .worker import AUTO_NEW_OUTPUTS, PREPARED, SHARED

SMALL_BYTES = 16 << 10
LARGE_BYTES = 64 << 20
AUTO_BOUND = 1.15
NEW_OUTPUTS_BOUND = 1.3
TCP_STREAM_SHARE = 0.6
TCP_GLOO_RATIO = 2.0
MPI_AT_64M = 2.8
GLOO_AT_64M = 3.0
# bench-strategies' MirroredStrategy step against the bare all-reduce: docs/benchmarks.md
# gives 0.86x-0.91x; the machine's run-to-run noise is about 15% more.
STRATEGY_STEP_BOUND = 1.05

# A run's ranks have deadlines of their own (bench/procs.py); this bounds the run as a whole,
# well past the longest here (4 ranks x 16 KiB-256 MiB: 70 s).
RUN_TIMEOUT_S = 1800
STOP_GRACE_S = 15

# Rows that are not an algorithm auto could have chosen.
NOT_ALGORITHMS = ("auto", AUTO_NEW_OUTPUTS, PREPARED, SHARED)


@dataclass
class Verdict:
    goal: int
    what: str
    measured: str  # the figures, or why nothing was measured
    target: str
    met: bool | None  # None: not measured
    runs: list[str] = field(default_factory=list)  # the runs it read (NAME.txt/.json in --out)


@dataclass
class Run:
    """One ``pycollective bench`` run (or another bench command), named for its files in --out."""

    name: str
    args: list[str]
    command: str = "bench"

    def argv(self, json_path: str) -> list[str]:
        extra = ["--json", json_path] if self.command == "bench" else []
        return python_module_command("pycollective.cli", self.command, *self.args, *extra)


def _shm(world: int, *args: str) -> list[str]:
    return ["--world", str(world), "--transports", "shm", *args]


def _sweep_runs() -> list[Run]:
    runs = []
    for world in (2, 3, 4):
        for new in (False, True):
            runs.append(
                Run(
                    f"auto_procs{world}_{'new' if new else 'out'}",
                    _shm(world, "-b", "8", "-e", "64M", "-f", "2", "--peers", "", "--budget", "0.2")
                    + (["--new-outputs"] if new else []),
                )
            )
    for world in range(2, 9):
        for new in (False, True):
            runs.append(
                Run(
                    f"auto_inproc{world}_{'new' if new else 'out'}",
                    ["--mode", "inproc", "--world", str(world), "-b", "8", "-e", "64M", "-f", "4"]
                    + ["--peers", "", "--budget", "0.2"]
                    + (["--new-outputs"] if new else []),
                )
            )
    return runs


def goal_runs() -> dict[int, list[Run]]:
    """The runs each goal reads, as the commands docs/benchmarks.md quotes."""
    mpi = ["--peers", "mpi", "--mpi-in-job", "--budget", "0.3"]
    new_row = ["-b", "64M", "-e", "64M", "--peers", "", "--new-outputs-row", "--budget", "0.3"]
    return {
        1: [
            Run(
                f"small_procs{w}",
                _shm(w, *mpi, "-b", "8", "-e", "16K", "-f", "4", "--algos", "auto,prepared"),
            )
            for w in (2, 4)
        ],
        2: [
            Run(
                f"sizes_procs{w}",
                _shm(w, *mpi, "-b", "16K", "-e", "256M", "-f", "4")
                + ["--algos", "auto,prepared,staged,halving_doubling"],
            )
            for w in (2, 4)
        ],
        3: [
            Run(
                "tcp_procs2",
                ["--world", "2", "-b", "64M", "-e", "64M", "--transports", "tcp", "--peers"]
                + ["gloo", "--algos", "auto", "--rounds", "3", "--budget", "0.3"],
            )
        ],
        4: _sweep_runs(),
        5: [Run(f"new_procs{w}", _shm(w, *new_row, "--algos", "auto,prepared")) for w in (2, 4)]
        + [
            Run(f"new_inproc{w}", ["--mode", "inproc", "--world", str(w), *new_row])
            for w in (2, 4, 8)
        ],
        6: [
            Run(
                "large_procs2",
                _shm(2, "-b", "64M", "-e", "64M", "--peers", "mpi,gloo", "--rounds", "2")
                + ["--algos", "auto,prepared,shared", "--budget", "0.3"],
            ),
            Run("strategies", [], command="bench-strategies"),
        ],
    }


def missing_peer(goal: int) -> str | None:
    """Why a goal's peer cannot run here, or None."""
    if goal in (1, 2, 6):
        if shutil.which("mpirun") is None:
            return "no mpirun on PATH (apt-get install openmpi-bin libopenmpi-dev)"
        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install mpi4py)"
    if goal in (3, 6) and importlib.util.find_spec("torch") is None:
        return "torch is not installed, so no gloo (pip install torch)"
    return None


# --- reading the runs (pure functions of bench's JSON, so that tests can feed them rows) ---


def _cells(data: dict) -> dict[tuple[str, int], list[dict]]:
    cells: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for row in data["rows"]:
        key = ("*" if row["peer"] else row["transport"], row["nbytes"])
        cells[key].append(row)
    return cells


def _own_best(rows: list[dict]) -> dict | None:
    """Our fastest row on the caller's own buffers: any algorithm, auto or prepared (not the
    `shared` arrays, which a caller gets only by allocating that way, nor new outputs)."""
    ours = [r for r in rows if not r["peer"] and r["algo"] not in (SHARED, AUTO_NEW_OUTPUTS)]
    return min(ours, key=lambda r: r["median_s"]) if ours else None


def peer_ratios(data: dict, peer: str) -> list[tuple[int, float, str]]:
    """(bytes, the peer's time / our fastest row's, that row) at every size the peer ran."""
    by_size: dict[int, list[dict]] = defaultdict(list)
    for row in data["rows"]:
        by_size[row["nbytes"]].append(row)
    out = []
    for nbytes, rows in sorted(by_size.items()):
        theirs = next((r for r in rows if r["peer"] and r["algo"] == peer), None)
        ours = _own_best(rows)
        if theirs and ours:
            out.append((nbytes, theirs["median_s"] / ours["median_s"], ours["algo"]))
    return out


def auto_cells(data: dict) -> list[tuple[int, str, float, float | None, str]]:
    """Per size and transport where auto ran: (bytes, transport, auto / the fastest algorithm in
    the sweep's pass, auto / the row it met head to head in its second look or None, the
    algorithm auto ran). That row is the pass's fastest of all, `prepared` included (auto's own
    call without the per-call checks), which makes the second look the stricter one."""
    out = []
    for (transport, nbytes), rows in sorted(_cells(data).items()):
        auto = next((r for r in rows if r["algo"] == "auto"), None)
        algos = [r for r in rows if not r["peer"] and r["algo"] not in NOT_ALGORITHMS]
        if auto is None or not algos:
            continue
        best = min(algos, key=lambda r: r["median_s"])
        look = (auto.get("extra") or {}).get("second_look")
        again = look["median_s"] / look["best_median_s"] if look else None
        chose = (auto.get("extra") or {}).get("chose") or "?"
        out.append((nbytes, transport, auto["median_s"] / best["median_s"], again, chose))
    return out


def auto_traps(cells: list[tuple[int, str, float, float | None, str]]) -> list[str]:
    """The cells over the bound in both looks (in the one pass where there was no second look),
    described."""
    traps = []
    for nbytes, transport, first, again, chose in cells:
        second = first if again is None else again
        if first > AUTO_BOUND and second > AUTO_BOUND:
            traps.append(
                f"{human_bytes(nbytes)} {transport}: {first:.2f}x, again {second:.2f}x (ran {chose})"
            )
    return traps


def new_output_ratio(data: dict) -> float | None:
    """auto's new outputs (`auto+new`) over auto's out= calls at the run's largest size."""
    rows = [r for r in data["rows"] if not r["peer"]]
    if not rows:
        return None
    largest = max(r["nbytes"] for r in rows)
    auto = next((r for r in rows if r["nbytes"] == largest and r["algo"] == "auto"), None)
    new = next((r for r in rows if r["nbytes"] == largest and r["algo"] == AUTO_NEW_OUTPUTS), None)
    return new["median_s"] / auto["median_s"] if auto and new else None


def tcp_figures(data: dict) -> tuple[float, float | None] | None:
    """auto over tcp at the run's largest size: (its busbw / one loopback stream's, its speed
    against gloo's or None)."""
    stream = data["ceilings"].get("loopback_tcp_Bps")
    autos = [r for r in data["rows"] if r["algo"] == "auto" and r["transport"] == "tcp"]
    if not stream or not autos:
        return None
    auto = max(autos, key=lambda r: r["nbytes"])
    gloo = next(
        (
            r
            for r in data["rows"]
            if r["peer"] and r["algo"] == "gloo" and r["nbytes"] == auto["nbytes"]
        ),
        None,
    )
    return auto["busbw_Bps"] / stream, (gloo["median_s"] / auto["median_s"] if gloo else None)


_STRATEGY_RATIO = re.compile(r"ratio ([0-9.]+)x")


def strategy_ratio(text: str) -> float | None:
    """The step / bare all-reduce ratio that `pycollective bench-strategies` prints last."""
    found = _STRATEGY_RATIO.findall(text)
    return float(found[-1]) if found else None


# --- verdicts ---


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}x-{max(values):.2f}x" if values else "-"


def judge_peer(goal: int, what: str, runs: dict[str, dict], names: list[str]) -> Verdict:
    below: list[str] = []
    measured = []
    met = True
    for name in names:
        ratios = peer_ratios(runs[name], "mpi")
        if not ratios:
            return Verdict(goal, what, f"{name}: no Open MPI row", ">= 1.00x", None, names)
        values = [r for _, r, _ in ratios]
        measured.append(f"{runs[name]['rows'][0]['world']} ranks {_span(values)}")
        slow = [f"{human_bytes(n)} {r:.2f}x ({algo})" for n, r, algo in ratios if r < 1.0]
        met = met and not slow
        below.extend(slow)
    text = "; ".join(measured) + (f"; below: {', '.join(below)}" if below else "")
    return Verdict(goal, what, text, "Open MPI's time / ours >= 1.00x at every size", met, names)


def judge(goal: int, runs: dict[str, dict], texts: dict[str, str]) -> Verdict:
    """The verdict of one goal from its runs' JSON (and, for goal 6, a command's output)."""
    names = [run.name for run in goal_runs()[goal]]
    if goal == 1:
        return judge_peer(1, "small messages, 8 B-16 KiB, vs Open MPI", runs, names)
    if goal == 2:
        return judge_peer(2, "16 KiB-256 MiB vs Open MPI", runs, names)
    if goal == 3:
        figures = tcp_figures(runs[names[0]])
        if figures is None:
            return Verdict(3, "tcp 2 x 64 MiB", "no tcp auto row or stream", "", None, names)
        share, gloo = figures
        met = share >= TCP_STREAM_SHARE and gloo is not None and gloo >= TCP_GLOO_RATIO
        gloo_text = f"{gloo:.2f}x gloo" if gloo is not None else "no gloo row"
        return Verdict(
            3,
            "tcp 2 x 64 MiB: auto vs one loopback stream and gloo",
            f"{share:.2f}x one stream, {gloo_text}",
            f">= {TCP_STREAM_SHARE}x one stream, >= {TCP_GLOO_RATIO}x gloo",
            met,
            names,
        )
    if goal == 4:
        traps: list[str] = []
        total = 0
        for name in names:
            cells = auto_cells(runs[name])
            total += len(cells)
            traps += [f"{name} {t}" for t in auto_traps(cells)]
        measured = f"{len(traps)} of {total} cells over {AUTO_BOUND}x in both looks"
        return Verdict(
            4,
            "auto vs the fastest algorithm, 8 B-64 MiB sweeps",
            measured + (": " + "; ".join(traps) if traps else ""),
            f"no cell over {AUTO_BOUND}x",
            not traps,
            names,
        )
    if goal == 5:
        ratios = {name: new_output_ratio(runs[name]) for name in names}
        known = [r for r in ratios.values() if r is not None]
        measured = ", ".join(
            f"{name.removeprefix('new_')} {r:.2f}x" for name, r in ratios.items() if r is not None
        )
        met = len(known) == len(names) and max(known) <= NEW_OUTPUTS_BOUND
        return Verdict(
            5, "new outputs vs out= at 64 MiB", measured, f"<= {NEW_OUTPUTS_BOUND}x", met, names
        )
    if goal == 6:
        large = runs[names[0]]
        mpi = peer_ratios(large, "mpi")
        gloo = peer_ratios(large, "gloo")
        step = strategy_ratio(texts.get("strategies", ""))
        if not mpi or not gloo or step is None:
            return Verdict(6, "64 MiB and the strategy step", "missing rows", "", None, names)
        mpi_r, gloo_r = mpi[-1][1], gloo[-1][1]
        met = mpi_r >= MPI_AT_64M and gloo_r >= GLOO_AT_64M and step <= STRATEGY_STEP_BOUND
        return Verdict(
            6,
            "no regression: 2 x 64 MiB vs peers; MirroredStrategy step vs bare all-reduce",
            f"{mpi_r:.2f}x Open MPI, {gloo_r:.2f}x gloo ({mpi[-1][2]}); step {step:.2f}x",
            f">= {MPI_AT_64M}x Open MPI, >= {GLOO_AT_64M}x gloo; step <= {STRATEGY_STEP_BOUND}x",
            met,
            names,
        )
    raise ValueError(f"bench-goals: there is no goal {goal} (goals are 1-6)")


# --- running ---


def run_one(run: Run, out: str, log: Callable[[str], None]) -> tuple[dict | None, str, str | None]:
    """Runs one bench command; (its JSON or None, its output, why it failed or None)."""
    json_path = os.path.join(out, run.name + ".json")
    text_path = os.path.join(out, run.name + ".txt")
    started = time.monotonic()
    returncode: int | None = None
    with open(text_path, "w") as text:
        proc = subprocess.Popen(
            run.argv(json_path), stdout=text, stderr=subprocess.STDOUT, env=child_environment()
        )
        try:
            returncode = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # An interrupt, as Ctrl-C would: bench then stops its ranks, whose process groups
            # are their own (killed outright, it left them running); a kill if that hangs.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    with open(text_path) as text:
        output = text.read()
    log(f"bench-goals: {run.name} ({time.monotonic() - started:.0f} s, exit {returncode})")
    if returncode is None:
        return (
            None,
            output,
            f"{run.name} ran past {RUN_TIMEOUT_S} s and was stopped; see {text_path}",
        )
    if returncode != 0:
        return None, output, f"{run.name} exited {returncode}; see {text_path}"
    if run.command != "bench":
        return None, output, None
    with open(json_path) as f:
        return json.load(f), output, None


def evaluate(goals: list[int], out: str, log: Callable[[str], None]) -> list[Verdict]:
    verdicts = []
    plans = goal_runs()
    for goal in goals:
        why = missing_peer(goal)
        if why:
            verdicts.append(Verdict(goal, f"goal {goal}", f"not measured: {why}", "", None))
            continue
        runs: dict[str, dict] = {}
        texts: dict[str, str] = {}
        failure = None
        for run in plans[goal]:
            data, text, failure = run_one(run, out, log)
            texts[run.name] = text
            if failure:
                break
            if data is not None:
                runs[run.name] = data
        if failure:
            verdicts.append(Verdict(goal, f"goal {goal}", f"not measured: {failure}", "", None))
            continue
        verdicts.append(judge(goal, runs, texts))
    return verdicts


def report(verdicts: list[Verdict]) -> list[str]:
    lines = []
    for v in verdicts:
        state = {True: "met", False: "NOT MET", None: "not measured"}[v.met]
        lines.append(f"goal {v.goal}: {state}: {v.what}")
        lines.append(f"    measured: {v.measured}")
        if v.target:
            lines.append(f"    target:   {v.target}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pycollective bench-goals",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--goals", default="1,2,3,4,5,6", help="comma-separated goals to measure (default: all)"
    )
    parser.add_argument(
        "--out",
        default=None,
        help="folder for every run's table and JSON (default: a new temp folder)",
    )
    parser.add_argument("--json", default=None, help="write the verdicts here as JSON")
    args = parser.parse_args(argv)
    try:
        goals = [int(g) for g in args.goals.split(",") if g.strip()]
    except ValueError:
        parser.error(f"--goals takes numbers 1-6 separated by commas, not {args.goals!r}")
    if not goals or any(g not in goal_runs() for g in goals):
        parser.error(f"--goals takes numbers 1-6 separated by commas, not {args.goals!r}")
    out = args.out or tempfile.mkdtemp(prefix="bench-goals-")
    os.makedirs(out, exist_ok=True)
    tuning = config.text("PYCOLLECTIVE_TUNING")
    print(
        f"bench-goals: goals {','.join(map(str, goals))}; runs and tables in {out}; "
        + (f"tuned by {tuning}" if tuning else "untuned (PYCOLLECTIVE_TUNING not set)"),
        flush=True,
    )
    verdicts = evaluate(goals, out, lambda line: print(line, flush=True))
    for line in report(verdicts):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(v) for v in verdicts], f, indent=1)
    return 0 if all(v.met is not False for v in verdicts) else 1
