"""Coordination service and clients: in threads and in real processes.

Every test has a hard deadline: threads are joined with a timeout, child
processes are SIGKILLed at teardown, and every wait on them is bounded.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

import pycollective.rendezvous as rdv
from pycollective._ports import PortReservation
from pycollective.rendezvous import (
    COORDINATOR_RANK,
    ClusterSpec,
    CoordinationClient,
    CoordinationService,
    RendezvousError,
    rendezvous,
)
from pycollective.rendezvous import coordination_pb2 as pb
from pycollective.rendezvous import coordination_pb2_grpc as pb_grpc

TOKEN = "test-token"
# The directory that holds the pycollective package these tests imported, so
# child processes import the very same one.
_PACKAGE_ROOT = str(Path(rdv.__file__).resolve().parents[2])


# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture
def make_service() -> Iterator[Callable[..., CoordinationService]]:
    services: list[CoordinationService] = []

    def make(world_size: int, **kwargs) -> CoordinationService:
        service = CoordinationService(world_size, TOKEN, **kwargs)
        service.start()
        services.append(service)
        return service

    yield make
    for service in services:
        service.stop(grace=0)


@pytest.fixture
def make_client() -> Iterator[Callable[..., CoordinationClient]]:
    clients: list[CoordinationClient] = []

    def make(address: str, rank: int, token: str = TOKEN, timeout: float = 10.0):
        client = CoordinationClient(address, rank, token, timeout=timeout)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()  # SIGKILL also ends a SIGSTOPped process
        proc.wait(timeout=10)


def in_threads(*calls: Callable[[], object], timeout: float = 15.0) -> list[object]:
    """Runs each call in its own thread; returns results or raised exceptions."""
    results: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # reported to the test, not lost in a thread
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    end = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    stuck = [i for i, thread in enumerate(threads) if thread.is_alive()]
    assert not stuck, f"calls {stuck} still running after {timeout} s"
    return results


def raw_stub(address: str) -> tuple[grpc.Channel, pb_grpc.CoordinationStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.CoordinationStub(channel)


class AbortRecorder:
    """An on_abort callback that remembers when and what it was told."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.calls: list[tuple[int, str, float]] = []

    def __call__(self, rank: int, reason: str) -> None:
        self.calls.append((rank, reason, time.monotonic()))
        self.event.set()

    def wait(self, timeout: float) -> tuple[int, str, float]:
        assert self.event.wait(timeout), f"no abort notice within {timeout} s"
        return self.calls[0]


def register_all(clients: list[CoordinationClient], world_size: int) -> list[object]:
    results = in_threads(
        *[lambda c=c: c.register(f"host-{c.rank}", {}, world_size=world_size) for c in clients]
    )
    for result in results:
        assert not isinstance(result, BaseException), result
    return results


CHILD_CLIENT = r"""
import os, sys, time
from pycollective.rendezvous import CoordinationClient
address, rank, token, world_size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
client = CoordinationClient(address, rank, token, timeout=20)
client.register(f"host-{rank}", {"tcp": f"127.0.0.1:{1000 + rank}"}, world_size=world_size)
def on_abort(failed, reason):
    print("ABORT", failed, reason, flush=True)
client.start_heartbeat(on_abort, interval=0.2)
print("READY", os.getpid(), flush=True)
time.sleep(30)
"""


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [_PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    return env


def spawn(children: list[subprocess.Popen], *args: str) -> tuple[subprocess.Popen, queue.Queue]:
    """Starts a child Python; its stdout lines arrive on the returned queue."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
    )
    children.append(proc)
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def expect_line(lines: queue.Queue, prefix: str, timeout: float) -> str:
    """The next line that starts with ``prefix``; fails the test after ``timeout``."""
    end = time.monotonic() + timeout
    seen = []
    while True:
        try:
            line = lines.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {prefix!r} line within {timeout} s; got {seen}") from None
        if line.startswith(prefix):
            return line
        seen.append(line)


@pytest.fixture
def reserved_port():
    """A port the OS chose, held (bound, never listening) for the whole test, so nobody else
    takes it before the test's listener binds it (pycollective/_ports.py)."""
    with PortReservation(1) as reserved:
        yield reserved.ports[0]


# -- registration ------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_register_returns_the_peer_table_to_every_rank(make_service, make_client):
    service = make_service(3)
    clients = [make_client(service.address, r) for r in range(3)]
    results = in_threads(
        *[
            lambda c=c: c.register(f"host-{c.rank % 2}", {"tcp": f"10.0.0.{c.rank}:4100"}, 3)
            for c in clients
        ]
    )
    for peers in results:
        assert [p.rank for p in peers] == [0, 1, 2]
        assert [p.host_id for p in peers] == ["host-0", "host-1", "host-0"]
        assert [p.endpoints for p in peers] == [{"tcp": f"10.0.0.{r}:4100"} for r in range(3)]
        assert all(p.pid == os.getpid() for p in peers)
    assert results[0] == results[1] == results[2]


@pytest.mark.timeout(30)
def test_register_refuses_a_duplicate_rank(make_service, make_client):
    service = make_service(2)
    first = make_client(service.address, 0)
    waiting = threading.Thread(target=lambda: first.register("a", {}, 2), daemon=True)
    waiting.start()
    time.sleep(0.3)
    channel, stub = raw_stub(service.address)
    with channel, pytest.raises(grpc.RpcError) as info:
        stub.Register(
            pb.RegisterRequest(rank=0, host_id="b", pid=os.getpid() + 1),
            timeout=5,
            metadata=(("x-pycollective-token", TOKEN),),
        )
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "rank 0 is already registered" in info.value.details()
    assert "two processes were given the same rank" in info.value.details()
    make_client(service.address, 1).register("c", {}, 2)
    waiting.join(10)
    assert not waiting.is_alive()


@pytest.mark.timeout(30)
def test_register_refuses_a_rank_out_of_range(make_service, make_client):
    service = make_service(2)
    with pytest.raises(RendezvousError) as info:
        make_client(service.address, 5).register("a", {}, 2)
    message = str(info.value)
    assert info.value.code == "INVALID_ARGUMENT"
    assert "rank 5" in message and "ranks 0..1" in message and service.address in message


@pytest.mark.timeout(30)
def test_register_refuses_a_different_world_size(make_service, make_client):
    service = make_service(2)
    with pytest.raises(RendezvousError, match="launched with world_size 3") as info:
        make_client(service.address, 1).register("a", {}, world_size=3)
    assert info.value.code == "FAILED_PRECONDITION"


@pytest.mark.timeout(30)
def test_register_timeout_names_the_missing_ranks(make_service, make_client):
    service = make_service(3)
    start = time.monotonic()
    with pytest.raises(RendezvousError) as info:
        make_client(service.address, 0, timeout=1.0).register("a", {}, 3)
    assert time.monotonic() - start < 20  # timeout=1.0 honoured, not the default wait
    message = str(info.value)
    assert info.value.code == "DEADLINE_EXCEEDED"
    assert "1 of 3 ranks registered" in message and "missing ranks [1, 2]" in message
    assert "Did every rank start?" in message


@pytest.mark.timeout(30)
def test_register_against_no_coordinator_says_what_to_check(make_client, reserved_port):
    address = f"127.0.0.1:{reserved_port}"
    with pytest.raises(RendezvousError) as info:
        make_client(address, 3, timeout=1.0).register("a", {}, 4)
    message = str(info.value)
    assert "rank 3 could not reach the coordinator at " + address in message
    assert "Is rank 0 running?" in message


@pytest.mark.timeout(30)
def test_register_retries_until_the_coordinator_starts(make_client, reserved_port):
    port = reserved_port
    client = make_client(f"127.0.0.1:{port}", 0, timeout=10.0)
    result: list[object] = []
    waiting = threading.Thread(
        target=lambda: result.append(client.register("a", {}, 1)), daemon=True
    )
    waiting.start()
    time.sleep(0.8)  # the client is already retrying
    service = CoordinationService(1, TOKEN, port=port)
    service.start()
    try:
        waiting.join(10)
        assert not waiting.is_alive()
        assert [p.rank for p in result[0]] == [0]
    finally:
        service.stop(grace=0)


@pytest.mark.timeout(30)
def test_port_in_use_is_a_clear_error(make_service):
    service = make_service(1)
    port = int(service.address.rsplit(":", 1)[1])
    with pytest.raises(RendezvousError, match="cannot listen on 127.0.0.1:.*already in use"):
        CoordinationService(1, TOKEN, port=port).start()


# -- barrier and key-value store ----------------------------------------------------------------


@pytest.mark.timeout(30)
def test_barrier_releases_only_when_every_rank_arrived_and_is_reusable(make_service, make_client):
    service = make_service(3)
    clients = [make_client(service.address, r) for r in range(3)]
    register_all(clients, 3)
    late_arrival = 0.5

    def arrive(client: CoordinationClient) -> float:
        if client.rank == 2:
            time.sleep(late_arrival)
        client.barrier("step")
        return time.monotonic()

    for _ in range(2):  # the same name twice
        start = time.monotonic()
        released = in_threads(*[lambda c=c: arrive(c) for c in clients])
        assert all(t - start >= late_arrival for t in released), released


@pytest.mark.timeout(30)
def test_barrier_timeout_names_who_is_missing(make_service, make_client):
    service = make_service(3)
    clients = [make_client(service.address, r) for r in range(3)]
    register_all(clients, 3)
    with pytest.raises(RendezvousError) as info:
        clients[1].barrier("sync", timeout=1.0)
    message = str(info.value)
    assert "barrier 'sync' timed out" in message
    assert "ranks [1] arrived, still waiting for ranks [0, 2]" in message
    assert "same barriers in the same order" in message
    # The rank that gave up is not counted: the barrier still needs all three.
    results = in_threads(*[lambda c=c: c.barrier("sync", timeout=5) for c in clients])
    assert results == [None, None, None]


@pytest.mark.timeout(30)
def test_get_waits_for_set(make_service, make_client):
    service = make_service(2)
    reader, writer = make_client(service.address, 0), make_client(service.address, 1)

    def set_later() -> None:
        time.sleep(0.3)
        writer.set("nccl-id", b"\x00\x01binary")

    value, _ = in_threads(lambda: reader.get("nccl-id", timeout=5), set_later)
    assert value == b"\x00\x01binary"


@pytest.mark.timeout(30)
def test_get_times_out_with_a_clear_error(make_service, make_client):
    service = make_service(2)
    client = make_client(service.address, 1)
    start = time.monotonic()
    with pytest.raises(RendezvousError) as info:
        client.get("never", timeout=1.0)
    elapsed = time.monotonic() - start
    # Not before the timeout; the upper bound only tells timeout=1.0 from a default wait, with
    # room for a loaded machine.
    assert 0.9 <= elapsed < 20
    message = str(info.value)
    assert message.startswith(f"rank 1: get('never') against the coordinator at {service.address}")
    assert "key 'never' was not set within 1.0 s" in message
    assert "Is another rank going to set this key" in message
    assert info.value.code == "DEADLINE_EXCEEDED"


@pytest.mark.timeout(30)
def test_add_is_atomic_and_readable(make_service, make_client):
    service = make_service(4)
    clients = [make_client(service.address, r) for r in range(4)]
    values = in_threads(*[lambda c=c: [c.add("count", 1) for _ in range(25)] for c in clients])
    seen = sorted(v for per_client in values for v in per_client)
    assert seen == list(range(1, 101))
    assert clients[0].add("count", -100) == 0
    assert clients[0].get("count") == b"0"


@pytest.mark.timeout(30)
def test_add_on_a_non_counter_and_set_of_non_bytes(make_service, make_client):
    service = make_service(1)
    client = make_client(service.address, 0)
    client.set("blob", b"\xff\xfe")
    with pytest.raises(RendezvousError, match="not a counter"):
        client.add("blob", 1)
    with pytest.raises(TypeError, match="stores bytes"):
        client.set("text", "not bytes")  # type: ignore[arg-type]


# -- authentication -----------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_missing_token_is_refused_and_logged(make_service, caplog):
    service = make_service(1)
    channel, stub = raw_stub(service.address)
    with caplog.at_level(logging.WARNING, logger="pycollective.rendezvous"):
        with channel, pytest.raises(grpc.RpcError) as info:
            stub.Get(pb.GetRequest(key="k"), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "carried no token" in info.value.details()
    assert any("refused" in r.getMessage() and "Get" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(30)
def test_wrong_token_is_refused_for_every_call(make_service, make_client):
    service = make_service(2)
    intruder = make_client(service.address, 0, token="wrong")
    for call in (
        lambda: intruder.register("a", {}, 2),
        lambda: intruder.set("k", b"v"),
        lambda: intruder.barrier("b", timeout=1),
        lambda: intruder.start_heartbeat(lambda rank, reason: None),
    ):
        with pytest.raises(RendezvousError) as info:
            call()
        assert info.value.code == "UNAUTHENTICATED"
        assert "token is wrong" in str(info.value)
        assert "same on every rank" in str(info.value)


# -- failure detection --------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_abort_reaches_every_client_within_2_s(make_service, make_client):
    service = make_service(3)
    clients = [make_client(service.address, r) for r in range(3)]
    register_all(clients, 3)
    recorders = [AbortRecorder() for _ in clients]
    for client, recorder in zip(clients, recorders):
        client.start_heartbeat(recorder, interval=0.2)
    start = time.monotonic()
    assert clients[1].abort("loss is NaN")
    for recorder in recorders:
        rank, reason, when = recorder.wait(2.0)
        assert rank == 1 and when - start < 2.0
        assert "rank 1 (host host-1, pid" in reason and "loss is NaN" in reason
    time.sleep(0.3)
    assert all(len(r.calls) == 1 for r in recorders)  # exactly once


@pytest.mark.timeout(30)
def test_abort_fails_a_waiting_barrier(make_service, make_client):
    service = make_service(3)
    clients = [make_client(service.address, r) for r in range(3)]
    register_all(clients, 3)

    def abort_later() -> None:
        time.sleep(0.3)
        clients[2].abort("out of memory")

    error, _ = in_threads(lambda: clients[0].barrier("b", timeout=10), abort_later)
    assert isinstance(error, RendezvousError) and error.code == "ABORTED"
    assert "out of memory" in str(error) and "rank 2" in str(error)


@pytest.mark.timeout(30)
def test_clean_close_is_not_a_failure(make_service, make_client):
    service = make_service(2, heartbeat_timeout=0.5)
    clients = [make_client(service.address, r) for r in range(2)]
    register_all(clients, 2)
    recorder = AbortRecorder()
    clients[0].start_heartbeat(recorder, interval=0.1)
    clients[1].start_heartbeat(lambda rank, reason: None, interval=0.1)
    clients[1].close()
    time.sleep(1.5)  # longer than the heartbeat timeout
    assert recorder.calls == []


@pytest.mark.timeout(30)
def test_short_heartbeat_window_keeps_healthy_ranks(make_service, make_client, monkeypatch):
    """PYCOLLECTIVE_HEARTBEAT_TIMEOUT under a second: the ranks beat at a quarter of it, not once
    a second (which left them silent for longer than the window: declared failed)."""
    from pycollective import config

    monkeypatch.setenv("PYCOLLECTIVE_HEARTBEAT_TIMEOUT", "0.8")
    config.reload()  # variables are read once
    try:
        service = make_service(2)
        clients = [make_client(service.address, r) for r in range(2)]
        register_all(clients, 2)
        recorders = [AbortRecorder(), AbortRecorder()]
        for client, recorder in zip(clients, recorders):
            client.start_heartbeat(recorder)
        time.sleep(4.0)  # five windows
        assert [r.calls for r in recorders] == [[], []]
    finally:
        monkeypatch.undo()
        config.reload()


@pytest.mark.timeout(30)
def test_stopping_the_coordinator_notifies_clients(make_service, make_client):
    service = make_service(2)
    clients = [make_client(service.address, r) for r in range(2)]
    register_all(clients, 2)
    recorder = AbortRecorder()
    clients[1].start_heartbeat(recorder, interval=0.2)
    service.stop(grace=0)
    rank, reason, _ = recorder.wait(3.0)
    assert rank == COORDINATOR_RANK
    assert "stopped" in reason or "lost its connection" in reason


@pytest.mark.timeout(30)
def test_killed_client_process_is_reported_within_2_s(make_service, make_client, children):
    service = make_service(3)
    rank0 = make_client(service.address, 0)
    registering = threading.Thread(target=lambda: rank0.register("host-0", {}, 3), daemon=True)
    registering.start()
    victim, victim_lines = spawn(children, "-c", CHILD_CLIENT, service.address, "1", TOKEN, "3")
    _, witness_lines = spawn(children, "-c", CHILD_CLIENT, service.address, "2", TOKEN, "3")
    expect_line(victim_lines, "READY", 20)
    expect_line(witness_lines, "READY", 20)
    registering.join(10)
    recorder = AbortRecorder()
    rank0.start_heartbeat(recorder, interval=0.2)

    start = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    rank, reason, when = recorder.wait(2.0)
    assert rank == 1 and when - start < 2.0
    assert f"rank 1 (host host-1, pid {victim.pid})" in reason
    assert "lost its connection" in reason
    line = expect_line(witness_lines, "ABORT", 2.0 - (time.monotonic() - start) + 0.2)
    assert line.startswith("ABORT 1 ") and f"pid {victim.pid}" in line


@pytest.mark.timeout(30)
def test_stopped_client_is_reported_after_the_heartbeat_timeout(
    make_service, make_client, children
):
    heartbeat_timeout = 2.0
    service = make_service(2, heartbeat_timeout=heartbeat_timeout)
    rank0 = make_client(service.address, 0)
    registering = threading.Thread(target=lambda: rank0.register("host-0", {}, 2), daemon=True)
    registering.start()
    frozen, frozen_lines = spawn(children, "-c", CHILD_CLIENT, service.address, "1", TOKEN, "2")
    expect_line(frozen_lines, "READY", 20)
    registering.join(10)
    recorder = AbortRecorder()
    rank0.start_heartbeat(recorder, interval=0.2)

    start = time.monotonic()
    frozen.send_signal(signal.SIGSTOP)
    rank, reason, when = recorder.wait(heartbeat_timeout + 3.0)
    # Silent for the timeout, noticed within the monitor's check interval.
    assert heartbeat_timeout - 0.5 <= when - start <= heartbeat_timeout + 1.5
    assert rank == 1
    assert f"rank 1 (host host-1, pid {frozen.pid}) stopped heartbeating" in reason
    assert "last heard from" in reason and "heartbeat timeout 2 s" in reason


@pytest.mark.timeout(30)
def test_rank_silent_from_the_moment_it_watches_is_reported(make_service, make_client):
    # A process can stop between opening its abort watch and its first heartbeat (CI saw it):
    # the service must count its silence from the watch, not wait for a first heartbeat.
    service = make_service(2, heartbeat_timeout=0.8)
    clients = [make_client(service.address, r) for r in range(2)]
    register_all(clients, 2)
    recorder = AbortRecorder()
    clients[0].start_heartbeat(recorder, interval=0.1)
    channel, stub = raw_stub(service.address)
    with channel:
        watch = stub.WatchAbort(
            pb.WatchAbortRequest(rank=1), metadata=(("x-pycollective-token", TOKEN),)
        )
        watch.initial_metadata()  # the service now watches rank 1, which never heartbeats
        rank, reason, _ = recorder.wait(5.0)
        watch.cancel()
    assert rank == 1 and "stopped heartbeating" in reason, reason


# -- bootstrap --------------------------------------------------------------------------------


BOOTSTRAP_CHILD = r"""
import json
from pycollective.rendezvous import ClusterSpec, rendezvous
spec = ClusterSpec.from_env()
client, peers, service = rendezvous(spec, {"tcp": f"127.0.0.1:{4000 + spec.rank}"}, timeout=20)
client.barrier("done", timeout=20)
print("PEERS", json.dumps([[p.rank, p.host_id, p.endpoints] for p in peers]), service is not None,
      flush=True)
client.close()
if service is not None:
    service.stop()
"""


@pytest.mark.timeout(60)
def test_bootstrap_in_processes(children, reserved_port):
    world_size, port = 3, reserved_port
    procs = []
    for rank in range(world_size):
        env = child_env()
        env.update(
            PYCOLLECTIVE_RANK=str(rank),
            PYCOLLECTIVE_WORLD_SIZE=str(world_size),
            PYCOLLECTIVE_MASTER_ADDR="127.0.0.1",
            PYCOLLECTIVE_MASTER_PORT=str(port),
            PYCOLLECTIVE_TOKEN=TOKEN,
            PYCOLLECTIVE_HOST_ID=f"fake-{rank // 2}",
        )
        # Start the non-zero ranks first: they must wait for rank 0.
        procs.append((rank, env))
    outputs = {}
    for rank, env in sorted(procs, key=lambda item: -item[0]):
        proc = subprocess.Popen(
            [sys.executable, "-c", BOOTSTRAP_CHILD],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        children.append(proc)
        outputs[rank] = proc
    expected = [[r, f"fake-{r // 2}", {"tcp": f"127.0.0.1:{4000 + r}"}] for r in range(3)]
    for rank, proc in outputs.items():
        out, _ = proc.communicate(timeout=40)
        assert proc.returncode == 0, out
        line = next(line for line in out.splitlines() if line.startswith("PEERS "))
        assert line == f"PEERS {json.dumps(expected)} {rank == 0}"


@pytest.mark.timeout(30)
def test_bootstrap_single_process_needs_no_token_or_port():
    spec = ClusterSpec.from_env({})
    client, peers, service = rendezvous(spec, {}, timeout=10)
    try:
        assert service is not None and [p.rank for p in peers] == [0]
        client.set("k", b"v")
        assert client.get("k") == b"v"
    finally:
        client.close()
        service.stop()


@pytest.mark.timeout(10)
def test_bootstrap_refuses_a_multi_rank_spec_without_token():
    spec = ClusterSpec(0, 1, 0, 1, "127.0.0.1", 0, "h", None, "test")
    object.__setattr__(spec, "world_size", 2)  # bypass the spec's own check
    with pytest.raises(ValueError, match="PYCOLLECTIVE_TOKEN"):
        rendezvous(spec, {}, timeout=1)


@pytest.mark.timeout(10)
def test_rendezvous_error_pickles_with_its_code():
    error = pickle.loads(pickle.dumps(RendezvousError("boom", code="ABORTED")))
    assert isinstance(error, RuntimeError)
    assert (str(error), error.code) == ("boom", "ABORTED")


@pytest.mark.timeout(30)
def test_a_counter_refuses_to_leave_the_64_bit_range_and_stays_usable():
    """Found by the control-plane fuzzer (bench/fault_fuzz.py): an add() past int64 made the
    handler raise after storing the overflowed value, breaking the counter for good."""
    with CoordinationService(1, "tok") as service:
        with CoordinationClient(service.address, 0, "tok", timeout=5) as client:
            assert client.add("c", 2**63 - 1) == 2**63 - 1
            with pytest.raises(RendezvousError, match="64-bit range") as refused:
                client.add("c", 1)
            assert refused.value.code == "OUT_OF_RANGE"
            assert client.add("c", -(2**63) + 1) == 0
