"""Collective slots: where the replica threads of one ``run()`` call meet.

Every replica-context collective (``all_reduce``, ``all_gather``, ``merge_call``, a variable
update with aggregation) is a *slot*: replica ``r``'s k-th call joins slot k. Each replica
deposits one value; the last to arrive runs the operation once for all of them (the
LocalCommunicator collective, which releases the GIL, or ``merge_fn``) and every replica picks
its own result.

Nothing waits forever:

- a replica that raises aborts every slot: the replicas waiting in a slot get
  :class:`ReplicaFailed` naming it, at once;
- a replica that returns from its function while others wait in a slot it never joined fails
  that slot at once (the classic "one replica took another branch" hang);
- replicas that call different operations as the same slot get :class:`pycollective.ProtocolError`;
- otherwise a slot that does not fill within ``timeout`` seconds raises
  :class:`pycollective.CollectiveTimeout` naming the replicas that never arrived.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pycollective as pc

_GATHERING, _RUNNING, _DONE = "gathering", "running", "done"


class ReplicaFailed(pc.RemoteError):
    """Raised in the replicas that were waiting for a replica that failed (or left).

    ``strategy.run`` re-raises the failing replica's own exception, not this one.
    """


class _Slot:
    __slots__ = (
        "arrived",
        "error",
        "error_replica",
        "index",
        "results",
        "state",
        "taken",
        "values",
        "what",
    )

    def __init__(self, index: int, what: str, n: int) -> None:
        self.index = index
        self.what = what
        self.values: list[Any] = [None] * n
        self.arrived: set[int] = set()
        self.state = _GATHERING
        self.results: Sequence[Any] | None = None
        self.error: BaseException | None = None
        self.error_replica: int | None = None
        self.taken = 0


class CollectiveSlots:
    """Slots for the ``num_replicas`` local replica threads of one ``run()`` call.

    Args:
        num_replicas: how many replica threads take part.
        timeout: seconds a replica waits for the others to reach a slot.
        names: how to name replica ``r`` in messages (default ``"replica r"``).
    """

    def __init__(
        self, num_replicas: int, timeout: float, names: Sequence[str] | None = None
    ) -> None:
        self._n = num_replicas
        self._timeout = float(timeout)
        self._names = (
            list(names) if names is not None else [f"replica {r}" for r in range(num_replicas)]
        )
        self._cond = threading.Condition()
        self._next = [0] * num_replicas
        self._slots: dict[int, _Slot] = {}
        self._done: set[int] = set()
        self._failure: BaseException | None = None  # every slot: nobody may wait any more

    @property
    def num_replicas(self) -> int:
        return self._n

    # Replica side ------------------------------------------------------------------------------

    def exchange(
        self,
        replica: int,
        what: str,
        value: Any,
        fn: Callable[[list[Any]], Sequence[Any]],
        timeout: float | None = None,
    ) -> Any:
        """Deposits ``value`` for ``replica`` in its next slot; returns ``fn(values)[replica]``.

        ``fn`` gets the values of all replicas in replica order and returns one result per
        replica; it runs once, on the thread of the last replica to arrive. ``timeout``: this
        call's wait for the others, instead of the slots' (one call's CommunicationOptions).
        """
        if self._n == 1:  # nobody to wait for or to wake: no slot, no lock
            index = self._next[0]
            self._next[0] += 1
            if self._failure is not None:
                raise self._failed(replica, what, index)
            results = fn([value])
            if len(results) != 1:
                raise pc.InternalError(f"{what}: {len(results)} results for 1 replica")
            return results[0]
        cond = self._cond
        with cond:
            index = self._next[replica]
            self._next[replica] += 1
            if self._failure is not None:
                raise self._failed(replica, what, index)
            slot = self._slots.get(index)
            if slot is None:
                slot = self._slots[index] = _Slot(index, what, self._n)
            if slot.what != what and slot.error is None:
                first = min(slot.arrived) if slot.arrived else None
                err = pc.ProtocolError(
                    f"{self._names[replica]} called {what} as collective #{index} of this "
                    f"run(), but {self._names[first]} called {slot.what}; every replica must "
                    "make the same collective calls in the same order"
                )
                self._fail_slot(slot, err, replica)
                raise err
            slot.values[replica] = value
            slot.arrived.add(replica)
            if slot.error is None:
                self._check_left(slot)
            runner = slot.error is None and len(slot.arrived) == self._n
            if runner:
                slot.state = _RUNNING
        if runner:
            return self._run(slot, replica, fn)
        return self._wait(slot, replica, self._timeout if timeout is None else float(timeout))

    def _run(self, slot: _Slot, replica: int, fn: Callable[[list[Any]], Sequence[Any]]) -> Any:
        try:
            results = fn(slot.values)
            if len(results) != self._n:
                raise pc.InternalError(
                    f"{slot.what}: {len(results)} results for {self._n} replicas"
                )
        except BaseException as exc:
            with self._cond:
                slot.values = [None] * self._n
                self._fail_slot(slot, exc, replica)
            raise
        with self._cond:
            slot.values = [None] * self._n
            slot.results = results
            slot.state = _DONE
            self._cond.notify_all()
            return self._take(slot, replica)

    def _wait(self, slot: _Slot, replica: int, timeout: float) -> Any:
        cond = self._cond
        deadline = time.monotonic() + timeout
        with cond:
            while True:
                if slot.state == _DONE:
                    return self._take(slot, replica)
                if slot.error is not None:
                    raise self._propagate(slot, replica)
                if self._failure is not None and slot.state == _GATHERING:
                    raise self._failed(replica, slot.what, slot.index)
                if slot.state == _RUNNING:
                    # The collective has its own deadline; poll so a failure is seen.
                    cond.wait(1.0)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = [self._names[r] for r in range(self._n) if r not in slot.arrived]
                    err = pc.CollectiveTimeout(
                        f"{self._names[replica]} waited {timeout:g} s in {slot.what} "
                        f"(collective #{slot.index} of this run()) for {', '.join(missing)}, "
                        "which never arrived. Every replica must make the same collective calls "
                        "in the same order; if replicas are legitimately slow, raise the timeout "
                        "(CommunicationOptions(timeout_seconds=...) or PYCOLLECTIVE_TIMEOUT)."
                    )
                    self._fail_slot(slot, err, replica)
                    self._failure = err
                    raise err
                cond.wait(remaining)

    def _take(self, slot: _Slot, replica: int) -> Any:
        assert slot.results is not None
        result = slot.results[replica]
        slot.taken += 1
        if slot.taken == self._n:
            self._slots.pop(slot.index, None)
        return result

    # Failures -------------------------------------------------------------------------------------

    def abort(self, replica: int, exc: BaseException) -> None:
        """``replica`` raised ``exc``: the replicas waiting for it stop waiting."""
        with self._cond:
            if self._failure is None:
                err = ReplicaFailed(f"{self._names[replica]} raised {type(exc).__name__}: {exc}")
                err.__cause__ = exc
                self._failure = err
            self._cond.notify_all()

    def cancel(self, reason: str) -> None:
        """Stops every wait (e.g. the thread that called run() was interrupted)."""
        with self._cond:
            if self._failure is None:
                self._failure = ReplicaFailed(reason)
            self._cond.notify_all()

    def replica_done(self, replica: int) -> None:
        """``replica`` returned from its function: slots it never joined can never fill."""
        with self._cond:
            self._done.add(replica)
            for slot in list(self._slots.values()):
                if slot.state == _GATHERING and slot.error is None:
                    self._check_left(slot)

    def _check_left(self, slot: _Slot) -> None:
        left = sorted(self._done - slot.arrived)
        if not left:
            return
        waiting = ", ".join(self._names[r] for r in sorted(slot.arrived))
        err = ReplicaFailed(
            f"{self._names[left[0]]} returned from its replica function without calling "
            f"{slot.what} (collective #{slot.index} of this run()), which {waiting} "
            "called; every replica must make the same collective calls in the same order"
        )
        self._fail_slot(slot, err, None)

    def _fail_slot(self, slot: _Slot, exc: BaseException, replica: int | None) -> None:
        if slot.error is None:
            slot.error = exc
            slot.error_replica = replica
        self._cond.notify_all()

    def _propagate(self, slot: _Slot, replica: int) -> BaseException:
        exc = slot.error
        assert exc is not None
        if isinstance(exc, ReplicaFailed) and slot.error_replica is None:
            return ReplicaFailed(str(exc))
        origin = self._names[slot.error_replica] if slot.error_replica is not None else "a replica"
        err = ReplicaFailed(
            f"{slot.what} (collective #{slot.index} of this run()) failed in "
            f"{origin} with {type(exc).__name__}: {exc}"
        )
        err.__cause__ = exc
        return err

    def _failed(self, replica: int, what: str, index: int) -> ReplicaFailed:
        cause = self._failure
        err = ReplicaFailed(
            f"{self._names[replica]} could not complete {what} (collective "
            f"#{index} of this run()): {cause}"
        )
        err.__cause__ = cause
        return err
