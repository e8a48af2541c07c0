"""A cluster of hosts on one Linux machine: network namespaces on a bridge, each host's link
shaped with ``tc``, ranks started the torchrun way. Root only; standard library only, so any
``python3`` runs it (``bench/netns_cluster.sh`` is the shell entry).

    bench/netns_cluster.sh HOSTS RANKS_PER_HOST RATE [options] -- COMMAND [ARGS...]
    bench/netns_cluster.sh 2 2 1gbit -- "$(command -v pycollective)" bench-compress

What it builds, per run (names carry a random run id, so two runs never collide):

- a bridge ``pc<id>br`` in the machine's own namespace, with no address (the machine's routes
  and interfaces are untouched);
- per host i a network namespace ``pycol-<id>-h<i>`` holding ``eth0`` (one end of a veth pair,
  the other end ``pc<id>b<i>`` on the bridge) with address ``<subnet>.<i+1>/24``, and ``lo``;
- the host's link shaped to RATE in both directions: a ``tbf`` qdisc on ``eth0`` inside the
  namespace limits what the host sends, one on the bridge-side end limits what it receives
  (the bridge forwards into the namespace through that end's egress). A veth pair has no wire,
  so shaping each end's egress is how a full-duplex link of RATE each way is made without an
  ``ifb`` device. tbf, not htb: one class per link is all there is to shape, and tbf's bucket
  is the link's whole model (rate, burst, queue). The bucket (burst) holds 1 ms at RATE (at
  least 64 KiB, a GSO packet): at 1gbit a single TCP stream then gets 0.93 Gbit/s, about
  what real gigabit Ethernet gives; with 0.1 ms it got 0.76 (the refill timer cannot keep
  up), with 4 ms 0.95. A message can start with up to one bucket unshaped (125 KB at 1gbit,
  an eighth of 1 MiB). The queue holds 10 ms at RATE.
  ``--netem`` adds a netem qdisc under each tbf (delay, loss, ...) for fault experiments;
- ranks: RANKS_PER_HOST per host, rank = host * RANKS_PER_HOST + local rank, each in its
  host's network namespace and in a UTS namespace of its own whose hostname is the host's
  (``pycol-<id>-h<i>``): pycollective keys "same host" on the hostname (PYCOLLECTIVE_HOST_ID
  is left unset), so ranks of one host share memory (shm links) and ranks of different hosts
  talk TCP over the shaped links. Each rank gets torchrun's variables: MASTER_ADDR (host 0's
  address), MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (its
  host), and a fresh PYCOLLECTIVE_TOKEN (nothing outside the cluster can reach its ranks).

Rank 0's output goes to this command's stdout/stderr; every other rank's to
``<logdir>/rank<r>.log`` (``--all-output`` sends every rank's to the terminal). When a rank
fails, the others are stopped and the failed rank's last lines are printed; the exit status is
that rank's. Everything is torn down on exit, on error, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

# Variables of other launchers that would outrank torchrun's in pycollective's detection
# (pycollective/rendezvous/cluster.py) or name another host: never passed to the ranks.
_LAUNCHER_VARIABLES = re.compile(
    r"^(PYCOLLECTIVE_(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_SIZE|MASTER_ADDR|MASTER_PORT|HOST_ID)"
    r"|TF_CONFIG|OMPI_COMM_WORLD_\w+|PMI_\w+|PMIX_\w+|SLURM_\w+|MASTER_ADDR|MASTER_PORT"
    r"|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK)$"
)

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$", re.IGNORECASE)
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}

# A rank that fails stops the others: SIGTERM, then SIGKILL after this many seconds.
STOP_GRACE_S = 5.0


class ClusterError(RuntimeError):
    """The cluster could not be built (not root, tools missing, namespaces not permitted)."""


def parse_rate(text: str) -> float | None:
    """Bits per second of a tc rate ("1gbit", "500mbit"); None for "none" (unshaped)."""
    if text.lower() in ("none", "0", "unshaped"):
        return None
    m = _RATE.match(text.strip())
    if m is None:
        raise ValueError(
            f"rate {text!r} is not a tc rate; write e.g. 1gbit, 10gbit, 500mbit, or none"
        )
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def check_can_build() -> None:
    """Raises ClusterError, saying what to do, where this process cannot build a cluster."""
    missing = [
        f"{tool} (package {package})"
        for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux"))
        if shutil.which(tool) is None
    ]
    if missing:
        raise ClusterError(f"missing tools: {', '.join(missing)}; install them and run again")
    if os.geteuid() != 0:
        raise ClusterError(
            "building network namespaces, a bridge and tc qdiscs needs root "
            "(CAP_NET_ADMIN and CAP_SYS_ADMIN); run it with sudo"
        )


def _run(cmd: Sequence[str], what: str) -> str:
    res = subprocess.run(list(cmd), capture_output=True, text=True)
    if res.returncode != 0:
        raise ClusterError(
            f"{what} failed: `{shlex.join(cmd)}` said: {(res.stderr or res.stdout).strip()}"
        )
    return res.stdout


class NetnsCluster:
    """`hosts` namespaces on a bridge, each host's link shaped to `rate` (a tc rate, or "none")
    with `netem` under it if given. Use as a context manager: entering builds it, leaving (also
    on an exception) tears it down. For fault experiments, shape() reshapes one host's link
    while ranks run (a rate, delay or loss of its own), and in_host() runs any command in a
    host's namespace (e.g. `ip link set eth0 down` to cut it off)."""

    def __init__(
        self,
        hosts: int,
        ranks_per_host: int,
        rate: str = "none",
        netem: str = "",
        subnet: str = "10.77.0",
        master_port: int = 29500,
        burst_s: float = 1e-3,
        queue_s: float = 10e-3,
    ) -> None:
        if not 1 <= hosts <= 250:
            raise ValueError(f"HOSTS must be 1..250, got {hosts}")
        if ranks_per_host < 1:
            raise ValueError(f"RANKS_PER_HOST must be >= 1, got {ranks_per_host}")
        if not re.fullmatch(r"\d+\.\d+\.\d+", subnet):
            raise ValueError(f"--subnet {subnet!r} must be three octets, e.g. 10.77.0")
        self.hosts, self.ranks_per_host = hosts, ranks_per_host
        self.rate, self.rate_bps = rate, parse_rate(rate)
        self.netem = netem
        self.subnet, self.master_port = subnet, master_port
        self.burst_s, self.queue_s = burst_s, queue_s
        self.id = secrets.token_hex(3)
        self.bridge = f"pc{self.id}br"
        self._made: list[tuple[str, str]] = []  # ("netns"|"link", name), in creation order

    # Names and addresses -------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.hosts * self.ranks_per_host

    def namespace(self, host: int) -> str:
        return f"pycol-{self.id}-h{host}"

    def hostname(self, host: int) -> str:
        return self.namespace(host)

    def address(self, host: int) -> str:
        return f"{self.subnet}.{host + 1}"

    def bridge_port(self, host: int) -> str:
        return f"pc{self.id}b{host}"

    def in_host(self, host: int, cmd: Sequence[str]) -> list[str]:
        """`cmd` run inside host's network namespace (no UTS namespace: for setup commands)."""
        return ["ip", "netns", "exec", self.namespace(host), *cmd]

    # Building and tearing down -------------------------------------------------------------

    def __enter__(self) -> NetnsCluster:
        check_can_build()
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _build(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge", "forward_delay", "0"], "bridge")
        self._made.append(("link", self.bridge))
        _run(["ip", "link", "set", self.bridge, "up"], "bridge up")
        for h in range(self.hosts):
            ns, port = self.namespace(h), self.bridge_port(h)
            try:
                _run(["ip", "netns", "add", ns], "network namespace")
            except ClusterError as exc:
                raise ClusterError(
                    f"{exc}\nthis machine does not permit network namespaces here (a container "
                    "without CAP_SYS_ADMIN?); run on a host or a privileged container"
                ) from None
            self._made.append(("netns", ns))
            _run(["ip", "link", "add", port, "type", "veth", "peer", "name", f"{port}n"], "veth")
            self._made.append(("link", port))
            _run(["ip", "link", "set", f"{port}n", "netns", ns], "veth into namespace")
            _run(self.in_host(h, ["ip", "link", "set", f"{port}n", "name", "eth0"]), "rename")
            _run(
                self.in_host(h, ["ip", "addr", "add", f"{self.address(h)}/24", "dev", "eth0"]),
                "address",
            )
            _run(self.in_host(h, ["ip", "link", "set", "eth0", "up"]), "eth0 up")
            _run(self.in_host(h, ["ip", "link", "set", "lo", "up"]), "lo up")
            _run(["ip", "link", "set", port, "master", self.bridge], "bridge port")
            _run(["ip", "link", "set", port, "up"], "bridge port up")
            self.shape(h, self.rate, self.netem)

    def shape(self, host: int, rate: str, netem: str = "") -> None:
        """(Re)shapes host's link, both directions: tbf at `rate`, netem under it if given."""
        bps = parse_rate(rate)
        for dev, prefix in (("eth0", self.in_host(host, [])), (self.bridge_port(host), [])):
            subprocess.run([*prefix, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
            parent = ["root"]
            if bps is not None:
                burst = max(64 * 1024, int(bps / 8 * self.burst_s))
                limit = max(2 * burst, int(bps / 8 * self.queue_s))
                _run(
                    [*prefix, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf"]
                    + ["rate", rate, "burst", str(burst), "limit", str(limit)],
                    f"tbf on {dev} of host {host}",
                )
                parent = ["parent", "1:1"]
            if netem:
                try:
                    _run(
                        [*prefix, "tc", "qdisc", "add", "dev", dev, *parent, "handle", "10:"]
                        + ["netem", *shlex.split(netem)],
                        f"netem on {dev} of host {host}",
                    )
                except ClusterError as exc:
                    raise ClusterError(
                        f"{exc}\n(a kernel without sch_netem says 'Specified qdisc kind is "
                        "unknown'; load the module or drop --netem)"
                    ) from None

    def down(self) -> None:
        """Stops whatever still runs in the namespaces, deletes them, the veths and the bridge.
        Safe to call twice; failures are reported, not raised (teardown must go on)."""
        for kind, name in reversed(self._made):
            if kind == "netns":
                pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
                for pid in pids.stdout.split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                res = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
            else:
                res = subprocess.run(["ip", "link", "del", name], capture_output=True, text=True)
                if "Cannot find device" in res.stderr:  # a veth goes with its namespace's end
                    continue
            if res.returncode != 0:
                print(
                    f"netns_cluster: could not remove {kind} {name}: {res.stderr.strip()}",
                    file=sys.stderr,
                )
        self._made.clear()

    # Ranks ---------------------------------------------------------------------------------

    def rank_command(self, rank: int, command: Sequence[str]) -> list[str]:
        """`command` as rank `rank` runs it: in its host's network namespace, in a UTS namespace
        of its own named after the host."""
        host = rank // self.ranks_per_host
        set_name = 'echo "$0" > /proc/sys/kernel/hostname && exec "$@"'
        return self.in_host(
            host, ["unshare", "--uts", "--", "sh", "-c", set_name, self.hostname(host), *command]
        )

    def rank_environment(self, rank: int, token: str, base: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if not _LAUNCHER_VARIABLES.match(k)}
        host, local = divmod(rank, self.ranks_per_host)
        env.update(
            MASTER_ADDR=self.address(0),
            MASTER_PORT=str(self.master_port),
            RANK=str(rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(local),
            LOCAL_WORLD_SIZE=str(self.ranks_per_host),
            GROUP_RANK=str(host),
            PYCOLLECTIVE_TOKEN=token,
        )
        return env

    def run(
        self,
        command: Sequence[str],
        timeout: float = 600.0,
        logdir: str | None = None,
        all_output: bool = False,
        env: dict[str, str] | None = None,
    ) -> int:
        """Runs `command` as every rank, in environment `env` (default: this process's) plus
        the rank's variables; returns 0 when every rank exited 0, else the first failed rank's
        status (124 when `timeout` seconds passed first). Without `logdir` the ranks' logs go
        to a temporary folder, kept where a rank failed or ran past the timeout (its path printed
        with that rank's last lines) and removed otherwise, on Ctrl-C too."""
        if logdir is None:
            logdir = tempfile.mkdtemp(prefix=f"pycol-netns-{self.id}-")
            code = None
            try:
                code = self._run_logged(command, timeout, logdir, all_output, env)
                return code
            finally:
                if not code:  # every rank exited 0, or the run was interrupted
                    shutil.rmtree(logdir, ignore_errors=True)
        return self._run_logged(command, timeout, logdir, all_output, env)

    def _run_logged(
        self,
        command: Sequence[str],
        timeout: float,
        logdir: str,
        all_output: bool,
        env: dict[str, str] | None,
    ) -> int:
        token = secrets.token_hex(16)
        base = dict(os.environ if env is None else env)
        os.makedirs(logdir, exist_ok=True)
        procs: list[subprocess.Popen] = []
        logs: list[str] = []
        try:
            for r in range(self.world_size):
                path = os.path.join(logdir, f"rank{r}.log")
                logs.append(path)
                out = None if r == 0 or all_output else open(path, "w")  # noqa: SIM115
                procs.append(
                    subprocess.Popen(
                        self.rank_command(r, command),
                        env=self.rank_environment(r, token, base),
                        stdout=out,
                        stderr=subprocess.STDOUT if out else None,
                        # A process group of its own in this session, as
                        # pycollective._spawn.own_process_group (why: there).
                        preexec_fn=lambda: os.setpgid(0, 0),
                    )
                )
                if out is not None:
                    out.close()
            return self._wait(procs, logs, timeout)
        finally:
            _stop(procs)

    def _wait(self, procs: list[subprocess.Popen], logs: list[str], timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                r = failed[0]
                print(
                    f"netns_cluster: rank {r} (host {r // self.ranks_per_host}) exited with "
                    f"status {codes[r]}; stopping the others{_tail(logs[r], r)}",
                    file=sys.stderr,
                )
                return int(codes[r] or 1)
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)
        running = [r for r, p in enumerate(procs) if p.poll() is None]
        print(
            f"netns_cluster: ranks {running} still running after {timeout:.0f} s; stopping them"
            + "".join(_tail(logs[r], r) for r in running[:2]),
            file=sys.stderr,
        )
        return 124


def _tail(path: str, rank: int, lines: int = 20) -> str:
    if rank == 0 or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        text = f.read().splitlines()[-lines:]
    return f"\n--- last lines of rank {rank} ({path}):\n" + "\n".join(text)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to every rank still running (its whole process group), SIGKILL after a grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)
        end = time.monotonic() + STOP_GRACE_S
        while any(p.poll() is None for p in alive) and time.monotonic() < end:
            time.sleep(0.05)
    for p in procs:
        p.wait()


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind like Ctrl-C, so the `with` block's teardown runs."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="netns_cluster.sh",
        description="Run COMMAND as every rank of HOSTS x RANKS_PER_HOST ranks, each host a "
        "network namespace on a bridge with its link shaped to RATE (root only).",
        usage="%(prog)s HOSTS RANKS_PER_HOST RATE [options] -- COMMAND [ARGS...]",
    )
    p.add_argument("hosts", type=int, help="number of hosts (network namespaces)")
    p.add_argument("ranks_per_host", type=int, help="ranks started in each host")
    p.add_argument("rate", help="each host's link, each direction: a tc rate (1gbit) or none")
    p.add_argument(
        "--netem",
        default="",
        help="netem parameters under each link's tbf, e.g. "
        '"delay 2ms loss 0.1%%" (needs sch_netem in the kernel)',
    )
    p.add_argument("--burst-ms", type=float, default=1.0, help="tbf bucket, ms at RATE")
    p.add_argument("--queue-ms", type=float, default=10.0, help="tbf queue, ms at RATE")
    p.add_argument("--subnet", default="10.77.0", help="first three octets of host addresses")
    p.add_argument("--port", type=int, default=29500, help="MASTER_PORT given to the ranks")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before ranks are killed")
    p.add_argument("--logdir", default=None, help="where ranks 1.. write rank<r>.log")
    p.add_argument("--all-output", action="store_true", help="every rank's output to the terminal")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        build_parser().print_usage(sys.stderr)
        print("netns_cluster: give the command after --", file=sys.stderr)
        return 2
    split = argv.index("--")
    args, command = build_parser().parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        print("netns_cluster: no command after --", file=sys.stderr)
        return 2
    try:
        with (
            _signals_raise(),
            NetnsCluster(
                args.hosts,
                args.ranks_per_host,
                args.rate,
                args.netem,
                args.subnet,
                args.port,
                args.burst_ms / 1e3,
                args.queue_ms / 1e3,
            ) as cluster,
        ):
            return cluster.run(command, args.timeout, args.logdir, args.all_output)
    except (ClusterError, ValueError) as exc:
        print(f"netns_cluster: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("netns_cluster: interrupted; the cluster is torn down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
