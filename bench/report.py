"""Turns rows into the terminal table, the summary, JSON, CSV and a plot."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Iterable
from typing import IO

from .metrics import human_bytes
from .rows import Row
from .worker import AUTO_NEW_OUTPUTS, AUTO_ROWS, SHARED, WATCHED

COLUMNS = [
    "size",
    "count",
    "dtype",
    "algorithm",
    "transport",
    "time(us)",
    "spread",
    "algbw(GB/s)",
    "busbw(GB/s)",
    "x floor",
    "#wrong",
]


def table(rows: Iterable[Row], out: IO[str]) -> None:
    rows = list(rows)
    lines = [COLUMNS]
    for r in rows:
        floor = r.extra.get("floor_s")
        lines.append(
            [
                human_bytes(r.nbytes),
                str(r.count),
                r.dtype,
                r.algo + (" (peer)" if r.peer else ""),
                r.transport,
                f"{r.median_s * 1e6:.1f}",
                f"{r.p10_s * 1e6:.0f}-{r.p90_s * 1e6:.0f}",
                f"{r.algbw / 1e9:.2f}",
                f"{r.busbw / 1e9:.2f}",
                f"{r.median_s / floor:.2f}" if floor else "-",
                str(r.wrong) if r.wrong == 0 else f"{r.wrong} WRONG",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    for k, line in enumerate(lines):
        out.write("  ".join(c.rjust(w) for c, w in zip(line, widths)) + "\n")
        if k == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def _best(ours: list[Row]) -> tuple[Row, Row]:
    """The fastest of our rows, and the fastest on the caller's own buffers: the 'shared' row
    runs on arrays made by pycollective.shared_empty, which a caller must have chosen to use, so
    auto and the peers are also set beside the best that needs no such choice."""
    overall = min(ours, key=lambda r: r.median_s)
    private = [r for r in ours if r.algo != SHARED] or ours
    return overall, min(private, key=lambda r: r.median_s)


def summary(rows: Iterable[Row], ceilings: dict | None = None) -> list[str]:
    """Which algorithm wins at which size, how auto did against the best, our ratio to every
    peer measured in the same run, and tcp against one loopback TCP stream (`ceilings`)."""
    rows = list(rows)
    by_key: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        by_key[(r.collective, r.transport if not r.peer else "*", r.nbytes)].append(r)
    lines: list[str] = []
    groups: dict[tuple, list] = defaultdict(list)
    for (coll, transport, nbytes), rs in sorted(by_key.items(), key=lambda kv: kv[0]):
        ours = [r for r in rs if not r.peer and r.algo not in AUTO_ROWS]
        if not ours:
            continue
        overall, best = _best(ours)
        auto = next((r for r in rs if r.algo == "auto"), None)
        text = f"{human_bytes(nbytes):>9}: "
        if overall is not best:
            text += f"{SHARED} arrays {overall.median_s * 1e6:.0f} us; on private buffers "
        text += f"best {best.algo} {best.median_s * 1e6:.0f} us"
        if auto is not None:
            text += f"; auto {auto.median_s / best.median_s:.2f}x of best"
            chose = auto.extra.get("chose")
            measures = auto.extra.get("measures")
            if chose == best.algo and measures == WATCHED:
                text += (
                    f" (it runs {chose} and times its calls, racing the others should it run "
                    "2x slower than usual: the gap is timing noise and that watch's cost)"
                )
            elif chose == best.algo and measures:
                text += (
                    f" (it runs {chose}, and now and then one of its near rivals: it keeps "
                    "timing them)"
                )
            elif chose == best.algo:
                text += (
                    f" (it runs {chose}: the same code plus a table lookup, so the gap "
                    "is timing noise)"
                )
            elif chose:
                chosen = next((r for r in ours if r.algo == chose), None)
                text += f" (it runs {chose}" + (
                    f", {chosen.median_s / best.median_s:.2f}x of best)" if chosen else ")"
                )
            look = auto.extra.get("second_look")
            if look:
                text += (
                    f"; again head to head with {look['best']}: auto "
                    f"{look['median_s'] / look['best_median_s']:.2f}x"
                )
        new = next((r for r in rs if r.algo == AUTO_NEW_OUTPUTS), None)
        if new is not None and auto is not None:
            text += (
                f"; new outputs (y = allreduce(x), {new.extra.get('chose') or 'auto'}) "
                f"{new.median_s / auto.median_s:.2f}x auto's out= calls"
            )
        floor = best.extra.get("floor_s")
        if floor:
            text += f"; best {best.median_s / floor:.2f}x the memory floor"
        groups[(coll, transport)].append(text)
    for (coll, transport), texts in groups.items():
        lines.append(f"{coll} over {transport}:")
        lines.extend("  " + t for t in texts)
    transports = sorted({r.transport for r in rows if not r.peer})
    if len(transports) > 1:
        for nbytes in sorted({r.nbytes for r in rows if not r.peer}):
            best = {}
            for t in transports:
                ours = [
                    r
                    for r in rows
                    if not r.peer
                    and r.transport == t
                    and r.nbytes == nbytes
                    and r.algo != AUTO_NEW_OUTPUTS
                ]
                if ours:
                    best[t] = min(ours, key=lambda r: r.median_s)
            if len(best) > 1:
                base = best.get("tcp") or next(iter(best.values()))
                lines.append(
                    f"transports at {human_bytes(nbytes)}: "
                    + ", ".join(
                        f"{t} {b.busbw / 1e9:.2f} GB/s ({base.median_s / b.median_s:.2f}x "
                        f"{base.transport})"
                        for t, b in best.items()
                    )
                )
    peers = [r for r in rows if r.peer]
    for p in peers:
        ours = [
            r
            for r in rows
            if not r.peer
            and r.collective == p.collective
            and r.nbytes == p.nbytes
            and r.algo not in AUTO_ROWS
        ]
        if not ours:
            continue
        overall, private = _best(ours)
        for best in [overall] if overall is private else [overall, private]:
            lines.append(
                f"vs {p.algo} ({p.transport}) at {human_bytes(p.nbytes)}: "
                f"{best.algo}/{best.transport} runs at {p.median_s / best.median_s:.2f}x "
                f"its speed (busbw {best.busbw / 1e9:.2f} vs {p.busbw / 1e9:.2f} GB/s)"
            )
    lines.extend(tcp_against_ceiling(rows, ceilings or {}))
    wrong = sum(r.wrong for r in rows)
    lines.append(
        "all results correct"
        if wrong == 0
        else f"WRONG RESULTS: {wrong} elements in {sum(1 for r in rows if r.wrong)} rows"
    )
    return lines


def tcp_against_ceiling(rows: list[Row], ceilings: dict) -> list[str]:
    """Per size, `auto` over tcp (the call a user makes) as a fraction of one loopback TCP stream
    measured in the same run: its busbw (the GB/s the table prints; with 2 ranks equal to algbw)
    over the stream's bytes per second; as a fraction of the two-way exchange ceiling (each rank
    of a ring sends and receives busbw at once, which is the most that ceiling allows); at the
    size whose buffers the large-buffer stream used, as a fraction of that stream (the call's
    own buffers leave the cache as that stream's do); and its speed against gloo
    (torch.distributed, also tcp) at the same size."""
    stream = ceilings.get("loopback_tcp_Bps")
    if not stream:
        return []
    exchange = ceilings.get("loopback_tcp_exchange_Bps")
    lines = []
    for r in sorted(rows, key=lambda r: (r.collective, r.nbytes)):
        if r.peer or r.transport != "tcp" or r.algo != "auto":
            continue
        text = (
            f"tcp {r.collective} at {human_bytes(r.nbytes)}: auto {r.busbw / 1e9:.2f} GB/s = "
            f"{r.busbw / stream:.2f}x one loopback TCP stream"
        )
        if exchange:
            text += f", {r.busbw / exchange:.2f}x the two-way exchange"
        span_stream = ceilings.get("loopback_tcp_span_Bps")
        if span_stream and r.nbytes == ceilings.get("loopback_tcp_span_bytes"):
            text += (
                f", {r.busbw / span_stream:.2f}x one stream from and into "
                f"{human_bytes(r.nbytes)} buffers"
            )
        gloo = next(
            (
                p
                for p in rows
                if p.peer
                and p.algo.startswith("gloo")
                and p.collective == r.collective
                and p.nbytes == r.nbytes
            ),
            None,
        )
        if gloo is not None:
            text += f"; {gloo.median_s / r.median_s:.2f}x gloo"
        lines.append(text)
    return lines


def write_json(rows: list[Row], ceilings: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump({"ceilings": ceilings, "rows": [r.as_dict() for r in rows]}, f, indent=1)


def write_csv(rows: list[Row], path: str) -> None:
    fields = [
        "collective",
        "nbytes",
        "count",
        "dtype",
        "algo",
        "transport",
        "world",
        "median_s",
        "p10_s",
        "p90_s",
        "algbw_Bps",
        "busbw_Bps",
        "wrong",
        "peer",
    ]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r.as_dict())


def machine_label() -> str:
    """Where and when a figure was measured: CPU model and count, kernel, UTC date and the
    pycollective build, so that a picture in docs/ says which machine it came from."""
    import datetime
    import os
    import platform

    import pycollective as pc
    from pycollective.doctor import commit

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()} | {when} | "
        f"pycollective {pc.__version__} ({commit()}), kernels {pc.build_info()['simd']}"
    )


def plot(rows: list[Row], ceilings: dict, path: str, command: str = "") -> None:
    """busbw vs size, one line per algorithm/transport/peer, log-scaled size axis: colour says
    the algorithm, line style the transport; peers are grey with crosses; the machine's
    ceilings measured in the same run are dotted horizontal lines. A footer names the machine,
    the date and `command`, the command line that made it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    lines: dict[tuple[str, str, str, bool], list[Row]] = defaultdict(list)
    for r in rows:
        lines[(r.collective, r.algo, r.transport, r.peer)].append(r)
    palette = plt.get_cmap("tab10").colors
    algos = sorted({k[1] for k in lines if not k[3]})
    color = {a: palette[i % len(palette)] for i, a in enumerate(algos)}
    style = {"shm": "-", "inproc": "-", "tcp": "--", "grpc": ":", "auto": "-."}
    peers = sorted({k[1] for k in lines if k[3]})
    for key, rs in sorted(lines.items()):
        collective, algo, transport, peer = key
        rs.sort(key=lambda r: r.nbytes)
        kw = (
            dict(
                color=str(0.2 + 0.5 * peers.index(algo) / max(1, len(peers))),
                marker="x",
                linestyle="-.",
            )
            if peer
            else dict(
                color=color[algo], marker="o", markersize=3, linestyle=style.get(transport, "-")
            )
        )
        ax.plot(
            [r.nbytes for r in rs],
            [r.busbw / 1e9 for r in rs],
            label=f"{algo} ({transport})" + (" [peer]" if peer else ""),
            **kw,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # peers and small sizes sit orders of magnitude below the best
    for name, value in ceilings.items():
        if name.endswith("_Bps"):
            ax.axhline(value / 1e9, color="grey", linewidth=0.8, linestyle=":")
            ax.text(
                ax.get_xlim()[1],
                value / 1e9,
                " " + name.removesuffix("_Bps"),
                fontsize=7,
                color="grey",
                va="center",
                ha="left",
            )
    ax.set_xlabel("message size (bytes per rank)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(
        f"pycollective {rows[0].collective if rows else ''}: busbw by size (nccl-tests definition)"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.12, 1.0))
    footer = machine_label() + (f"\n$ {command}" if command else "")
    fig.text(0.01, 0.01, footer, fontsize=6.5, color="dimgrey", va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
