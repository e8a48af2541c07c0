"""Fault tolerance of ParameterServerStrategy with real task processes (``python -m
pycollective.strategies.parameter_server``, each on an OS-chosen port it reports):

- a worker killed mid-training: its function runs again on the other worker, training
  finishes; the worker restarted on its address rejoins (its per-worker iterator is made anew);
- a ps task killed: the coordinator raises UnavailableError naming the task within the RPC
  deadline; after the task is back, training resumes from the last checkpoint without losing a
  checkpointed update;
- the same with checkpointing on (ClusterCoordinator.enable_checkpointing): the coordinator
  waits for the restarted task, restores the last checkpoint on every ps task and runs the
  functions since then again, without an error; it gives up, naming the task, when the task
  does not come back. (test_ps_restart.py: the launcher restarts the task, digits converge.)

The functions scheduled here are module-level functions of this file: the workers import them
(tests/ is on their PYTHONPATH), which is how a program without cloudpickle works too.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from pycollective._spawn import own_process_group
from pycollective.launcher import _die_with_parent
from pycollective.strategies import (
    SGD,
    Checkpoint,
    ClusterCoordinator,
    FixedShardsPartitioner,
    ParameterServerStrategy,
    SimpleClusterResolver,
    Variable,
)
from pycollective.strategies.parameter_server import UnavailableError

TOKEN = "faults-token"
HERE = os.path.dirname(os.path.abspath(__file__))
_STARTUP_S = 30.0
_TASK_MODULE = "pycollective.strategies.parameter_server"
# Dies with the test process (PR_SET_PDEATHSIG = 1), then runs the task module.
_DIE_WITH_PARENT_THEN_RUN = (
    "import ctypes, os, runpy, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "del sys.path[0]\n"
    "sys.argv = [sys.argv[2]]\n"
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
)


class Task:
    """One ps or worker process; ``address`` is where it listens."""

    def __init__(self, job: str, index: int, address: str = "127.0.0.1:0") -> None:
        env = dict(os.environ)
        env.update(
            {
                "PYCOLLECTIVE_TOKEN": TOKEN,
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {job: ["127.0.0.1:0"] * index + [address]},
                        "task": {"type": job, "index": index},
                    }
                ),
                "PYTHONPATH": os.pathsep.join(
                    [HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
                ),
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.job, self.index = job, index
        if sys.version_info >= (3, 11):
            # No Python code between fork and exec: a task restarted while this process runs
            # the coordinator's threads must not run preexec_fn in a child forked from them
            # (seen: a segfault in threading._after_fork). The child dies with this process.
            spawn = {"process_group": 0}
            argv = [sys.executable, "-c", _DIE_WITH_PARENT_THEN_RUN, str(os.getpid()), _TASK_MODULE]
        else:
            spawn = {"preexec_fn": own_process_group(then=_die_with_parent(os.getpid()))}
            argv = [sys.executable, "-m", _TASK_MODULE]
        self.process = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **spawn
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.address = self._wait_address()

    def _read(self) -> None:
        for raw in iter(self.process.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip()
            self.log.append(line)
            self.lines.put(line)

    def _wait_address(self) -> str:
        deadline = time.monotonic() + _STARTUP_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            if " serving on " in line:
                return line.rsplit(" ", 1)[-1]
        self.kill()
        self._reader.join(timeout=5)  # the output of a task that exited at once
        raise AssertionError(f"{self.job} {self.index} did not start:\n" + "\n".join(self.log))

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


@pytest.fixture
def tasks():
    started: list[Task] = []

    def start(job: str, index: int, address: str = "127.0.0.1:0") -> Task:
        task = Task(job, index, address)
        started.append(task)
        return task

    yield start
    for task in started:
        task.kill()


def make_strategy(ps, workers, **kwargs):
    cluster = {
        "chief": ["127.0.0.1:1"],
        "ps": [t.address for t in ps],
        "worker": [t.address for t in workers],
    }
    return ParameterServerStrategy(
        SimpleClusterResolver(cluster, task_type="chief", task_id=0), token=TOKEN, **kwargs
    )


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# Scheduled on the workers ------------------------------------------------------------------------------


def ones_dataset():
    while True:
        yield np.ones(4, np.float32)


def slow_step(var, optimizer, iterator):
    time.sleep(0.04)
    optimizer.apply_gradients([(next(iterator), var)])
    return os.getpid()


def slow_ones_step(var, optimizer):
    time.sleep(0.02)
    optimizer.apply_gradients([(np.ones(var.shape, np.float32), var)])
    return os.getpid()


def ones_step(var, optimizer):
    optimizer.apply_gradients([(np.ones(var.shape, np.float32), var)])
    return 0


def late_ones_step(var, optimizer, seconds):
    time.sleep(seconds)  # past the coordinator's closure_timeout
    optimizer.apply_gradients([(np.ones(var.shape, np.float32), var)])
    return 0


# Tests --------------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_killed_worker_finishes_on_the_others_and_rejoins(tasks):
    ps = [tasks("ps", 0)]
    workers = [tasks("worker", 0), tasks("worker", 1)]
    strategy = make_strategy(ps, workers, rpc_timeout=5, closure_timeout=20)
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = Variable(np.zeros(4, np.float32), name="v")
        opt = SGD(1.0)
    iterator = iter(coordinator.create_per_worker_dataset(ones_dataset))
    results = [coordinator.schedule(slow_step, args=(v, opt, iterator)) for _ in range(40)]
    wait_until(lambda: sum(r._done for r in results) >= 8, 30, "8 steps")
    pids = {r.fetch() for r in results if r._done}
    workers[1].kill()
    coordinator.join()  # the killed worker's function ran again on worker 0
    assert all(isinstance(r.fetch(), np.integer) for r in results)
    assert workers[1].process.pid in pids  # it did work before it died
    iterations = int(opt.iterations.read_value())
    # A function may have pushed just before its worker died, and then ran again.
    assert 40 <= iterations <= 41
    np.testing.assert_array_equal(v.read_value(), np.full(4, -float(iterations)))

    restarted = tasks("worker", 1, workers[1].address)
    dispatcher = coordinator._dispatchers[1]
    wait_until(lambda: dispatcher.state == "alive", 20, "worker 1 to rejoin")
    more = [coordinator.schedule(slow_step, args=(v, opt, iterator)) for _ in range(20)]
    coordinator.join()
    assert restarted.process.pid in {r.fetch() for r in more}  # the new process took work
    assert int(opt.iterations.read_value()) == iterations + 20
    coordinator.close()


@pytest.mark.timeout(60)
def test_killed_ps_raises_within_deadline_and_resumes_from_checkpoint(tasks, tmp_path):
    ps = [tasks("ps", 0), tasks("ps", 1)]
    workers = [tasks("worker", 0)]
    rpc_timeout = 2.0
    kwargs = {
        "variable_partitioner": FixedShardsPartitioner(2),
        "rpc_timeout": rpc_timeout,
        "closure_timeout": 20,
    }
    strategy = make_strategy(ps, workers, **kwargs)
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = Variable(np.zeros((4, 2), np.float32), name="v")
        opt = SGD(0.1, momentum=0.9)
    for _ in range(6):
        coordinator.schedule(ones_step, args=(v, opt))
    coordinator.join()
    path = Checkpoint(v=v, optimizer=opt).write(str(tmp_path / "ckpt.npz"))
    saved = v.read_value()
    saved_momentum = opt.get_slot(v, "momentum").read_value()
    for _ in range(3):
        coordinator.schedule(ones_step, args=(v, opt))
    coordinator.join()

    ps[1].kill()
    start = time.monotonic()
    coordinator.schedule(ones_step, args=(v, opt))
    with pytest.raises(UnavailableError, match=r"/job:ps/replica:0/task:1") as info:
        coordinator.join()
    elapsed = time.monotonic() - start
    assert info.value.task == "/job:ps/replica:0/task:1"
    # At the RPC deadline (2 s) or sooner; the bound tells that from the closure timeout (20 s),
    # with room for a loaded machine.
    assert elapsed < rpc_timeout + 12.0, elapsed
    start = time.monotonic()
    with pytest.raises(UnavailableError, match="restore the last checkpoint"):
        v.read_value()  # the coordinator's own calls fail the same way
    assert time.monotonic() - start < rpc_timeout + 12.0
    coordinator.close()

    # The ps task is back (empty); like a restarted coordinator program, build the model again
    # and restore the checkpoint: every checkpointed update is there.
    tasks("ps", 1, ps[1].address)
    strategy = make_strategy(ps, workers, **kwargs)
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = Variable(np.zeros((4, 2), np.float32), name="v")
        opt = SGD(0.1, momentum=0.9)
    Checkpoint(v=v, optimizer=opt).restore(path).assert_consumed()
    np.testing.assert_array_equal(v.read_value(), saved)
    np.testing.assert_array_equal(opt.get_slot(v, "momentum").read_value(), saved_momentum)
    assert int(opt.iterations.read_value()) == 6
    for _ in range(3):
        coordinator.schedule(ones_step, args=(v, opt))
    coordinator.join()
    expected, momentum = saved.copy(), saved_momentum.copy()
    for _ in range(3):
        momentum = 0.9 * momentum - 0.1
        expected = expected + momentum
    np.testing.assert_allclose(v.read_value(), expected, rtol=1e-6)
    assert int(opt.iterations.read_value()) == 9
    coordinator.close()


def momentum_steps(start, momentum, steps, lr=0.1, beta=0.9):
    """numpy reference: ``steps`` SGD-with-momentum updates with a gradient of ones."""
    value, velocity = start.astype(np.float64), momentum.astype(np.float64)
    for _ in range(steps):
        velocity = beta * velocity - lr
        value = value + velocity
    return value, velocity


@pytest.mark.timeout(90)
def test_checkpointing_restores_a_restarted_ps_and_loses_no_update(tasks, tmp_path):
    ps = [tasks("ps", 0), tasks("ps", 1)]
    workers = [tasks("worker", 0), tasks("worker", 1)]
    strategy = make_strategy(
        ps,
        workers,
        variable_partitioner=FixedShardsPartitioner(2),
        rpc_timeout=3,
        closure_timeout=30,
    )
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = Variable(np.zeros((6, 2), np.float32), name="v")  # a shard on each ps task
        opt = SGD(0.1, momentum=0.9)
    checkpoint = Checkpoint(v=v, optimizer=opt)
    seen = []

    def on_recovery(record):  # runs before any function runs again
        with np.load(record.checkpoint) as saved:
            seen.append(
                {
                    "record": record,
                    "v": v.read_value(),
                    "momentum": opt.get_slot(v, "momentum").read_value(),
                    "iterations": int(opt.iterations.read_value()),
                    "saved_v": saved["v"],
                    "saved_momentum": saved["optimizer/slots/v/momentum"],
                    "saved_iterations": int(saved["optimizer/iterations"]),
                }
            )

    coordinator.enable_checkpointing(
        checkpoint, str(tmp_path), every_functions=7, restart_timeout=30, on_recovery=on_recovery
    )
    steps, kill_after = 60, int(np.random.default_rng(17).integers(15, 35))
    results = [coordinator.schedule(slow_ones_step, args=(v, opt)) for _ in range(steps)]
    wait_until(lambda: sum(r._done for r in results) >= kill_after, 40, f"{kill_after} steps")
    ps[1].kill()  # SIGKILL; the test restarts it, as pycollective run --max-restarts does
    restarted = tasks("ps", 1, ps[1].address)
    assert restarted.process.pid != ps[1].process.pid
    coordinator.join()  # no error: the recovery is invisible here
    assert all(isinstance(r.fetch(), np.integer) for r in results)

    assert len(coordinator.recoveries) == 1, coordinator.recoveries
    record = coordinator.recoveries[0]
    assert record.task == "/job:ps/replica:0/task:1"
    assert record.restarted == ("/job:ps/replica:0/task:1",)
    assert record.replayed >= 1
    (after,) = seen
    # Right after the restore, every ps task holds exactly the checkpoint: no checkpointed update
    # is lost, and the updates since were rolled back on the surviving task too.
    np.testing.assert_array_equal(after["v"], after["saved_v"])
    np.testing.assert_array_equal(after["momentum"], after["saved_momentum"])
    assert after["iterations"] == after["saved_iterations"] >= 7
    # The functions since the checkpoint ran again: every step applied exactly once.
    assert int(opt.iterations.read_value()) == steps
    expected, velocity = momentum_steps(np.zeros((6, 2)), np.zeros((6, 2)), steps)
    np.testing.assert_allclose(v.read_value(), expected, rtol=1e-5)
    np.testing.assert_allclose(opt.get_slot(v, "momentum").read_value(), velocity, rtol=1e-5)
    latest = coordinator.latest_checkpoint
    assert latest is not None and os.path.exists(latest)
    assert len(os.listdir(tmp_path)) <= 2  # keep=2
    coordinator.close()


@pytest.mark.timeout(60)
def test_checkpointing_gives_up_naming_the_ps_that_does_not_come_back(tasks, tmp_path):
    ps = [tasks("ps", 0), tasks("ps", 1)]
    workers = [tasks("worker", 0)]
    rpc_timeout, restart_timeout = 2.0, 3.0
    strategy = make_strategy(
        ps,
        workers,
        variable_partitioner=FixedShardsPartitioner(2),
        rpc_timeout=rpc_timeout,
        closure_timeout=20,
    )
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = Variable(np.zeros((4, 2), np.float32), name="v")
        opt = SGD(0.1)
    coordinator.enable_checkpointing(
        Checkpoint(v=v, optimizer=opt),
        str(tmp_path),
        every_functions=3,
        restart_timeout=restart_timeout,
    )
    for _ in range(6):
        coordinator.schedule(ones_step, args=(v, opt))
    coordinator.join()
    ps[1].kill()  # and nobody restarts it
    start = time.monotonic()
    waiting = [coordinator.schedule(ones_step, args=(v, opt)) for _ in range(4)]
    with pytest.raises(UnavailableError, match="did not answer within 3 s") as info:
        coordinator.join()
    elapsed = time.monotonic() - start
    assert info.value.task == "/job:ps/replica:0/task:1"
    assert ps[1].address in str(info.value)
    assert "--max-restarts" in str(info.value)
    # The RPC deadline, then the restart timeout; the bound leaves room for a loaded machine.
    assert elapsed < rpc_timeout + restart_timeout + 15.0, elapsed
    for rv in waiting:
        with pytest.raises(UnavailableError):
            rv.fetch()
    assert coordinator.recoveries == []
    coordinator.close()


@pytest.mark.timeout(60)
def test_checkpointing_refuses_to_restore_without_the_optimizer(tasks, tmp_path):
    """A Checkpoint without the optimizer would restore the variables on every ps task but
    leave the optimizer's iterations and slots newer on the survivors and empty on the
    restarted one: the coordinator gives up, naming what is missing, before it restores."""
    ps = [tasks("ps", 0), tasks("ps", 1)]
    workers = [tasks("worker", 0)]
    strategy = make_strategy(
        ps, workers, variable_partitioner=FixedShardsPartitioner(2), rpc_timeout=2.0
    )
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = Variable(np.zeros((4, 2), np.float32), name="v")
        opt = SGD(0.1, momentum=0.9)
    coordinator.enable_checkpointing(Checkpoint(v=v), str(tmp_path), every_functions=3)
    for _ in range(6):
        coordinator.schedule(ones_step, args=(v, opt))
    coordinator.join()
    ps[1].kill()
    tasks("ps", 1, ps[1].address)  # back, empty
    with pytest.raises(RuntimeError, match=r"optimizer .* not in the checkpoint"):
        # schedule() itself may raise it: the checkpoint due before the next function meets
        # the lost task first
        coordinator.schedule(ones_step, args=(v, opt))
        coordinator.join()
    assert coordinator.recoveries == []
    coordinator.close()


@pytest.mark.timeout(60)
def test_a_function_the_coordinator_gave_up_on_writes_nothing_after(tasks):
    """The coordinator stops waiting for a function (here: past closure_timeout; a broken
    connection to its worker does the same) while the worker still runs it: its late push is
    refused on the worker, so the update cannot land beside a retry or a restore."""
    ps = [tasks("ps", 0)]
    workers = [tasks("worker", 0)]
    strategy = make_strategy(ps, workers, rpc_timeout=5, closure_timeout=1.0)
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = Variable(np.zeros((4, 2), np.float32), name="v")
        opt = SGD(0.1)
    coordinator.schedule(ones_step, args=(v, opt))
    coordinator.join()
    late = coordinator.schedule(late_ones_step, args=(v, opt, 2.5))
    with pytest.raises(RuntimeError, match="late_ones_step"):
        coordinator.join()
    with pytest.raises(RuntimeError):
        late.fetch()
    time.sleep(3.0)  # the worker wakes up and tries to push
    assert int(opt.iterations.read_value()) == 1
    np.testing.assert_array_equal(v.read_value(), np.full((4, 2), -0.1, np.float32))
    coordinator.close()


@pytest.mark.timeout(60)
def test_checkpoints_are_consistent_cuts(tasks, tmp_path):
    """Every checkpoint is taken while no function runs: its variables, slots and iterations
    agree (without the pause they would be read while pushes land between them)."""
    ps = [tasks("ps", 0), tasks("ps", 1)]
    workers = [tasks("worker", 0), tasks("worker", 1)]
    strategy = make_strategy(
        ps, workers, variable_partitioner=FixedShardsPartitioner(2), rpc_timeout=5
    )
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = Variable(np.zeros((6, 2), np.float32), name="v")
        opt = SGD(0.1, momentum=0.9)
    coordinator.enable_checkpointing(
        Checkpoint(v=v, optimizer=opt),
        str(tmp_path),
        every_functions=5,
        every_seconds=0.2,
        keep=1000,
    )
    for _ in range(40):
        coordinator.schedule(slow_ones_step, args=(v, opt))
    coordinator.join()
    wait_until(  # the checkpoint after the last function may still be written
        lambda: (
            coordinator.latest_checkpoint
            and int(np.load(coordinator.latest_checkpoint)["optimizer/iterations"]) == 40
        ),
        20,
        "the last checkpoint",
    )
    files = sorted(os.listdir(tmp_path), key=lambda n: int(n[len("ckpt-") : -len(".npz")]))
    counts = []
    for name in files:
        with np.load(tmp_path / name) as saved:
            iterations = int(saved["optimizer/iterations"])
            expected, velocity = momentum_steps(np.zeros((6, 2)), np.zeros((6, 2)), iterations)
            np.testing.assert_allclose(saved["v"], expected, rtol=1e-5, err_msg=name)
            np.testing.assert_allclose(
                saved["optimizer/slots/v/momentum"], velocity, rtol=1e-5, err_msg=name
            )
            counts.append(iterations)
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == 40, counts
    # At most every 5 finished functions, plus the one still running on the other worker when
    # the checkpoint became due; every_seconds adds some in between.
    assert max(b - a for a, b in zip(counts, counts[1:])) <= 6, counts
    coordinator.close()


@pytest.mark.timeout(60)
def test_checkpointing_gives_up_when_a_ps_fails_before_the_first_checkpoint(tasks, tmp_path):
    ps = [tasks("ps", 0), tasks("ps", 1)]
    workers = [tasks("worker", 0)]
    strategy = make_strategy(ps, workers, rpc_timeout=2, closure_timeout=20)
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        a = Variable(np.zeros(4, np.float32), name="a")  # on ps 0
        b = Variable(np.zeros(4, np.float32), name="b")  # on ps 1
        opt = SGD(0.1)
    coordinator.schedule(ones_step, args=(b, opt))
    coordinator.join()
    ps[1].kill()
    coordinator.enable_checkpointing(
        Checkpoint(a=a, b=b, optimizer=opt), str(tmp_path), restart_timeout=5
    )
    coordinator.schedule(ones_step, args=(b, opt))  # the first checkpoint fails
    with pytest.raises(UnavailableError, match="before the first checkpoint") as info:
        coordinator.join()
    assert info.value.task == "/job:ps/replica:0/task:1"
    assert coordinator.latest_checkpoint is None
    coordinator.close()
