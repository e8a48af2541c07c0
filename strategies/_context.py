"""Which strategy is current, and whether this thread is in a replica or cross-replica context.

State is per thread: ``strategy.scope()`` pushes a cross-replica frame on the calling thread;
``strategy.run`` gives each replica thread a frame holding its ReplicaContext; ``merge_call``
pushes a cross-replica frame on the thread that runs ``merge_fn``. With no frame at all, the
default strategy (one replica, this thread) is current and its default ReplicaContext applies,
as in tf.distribute.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .strategy import ReplicaContext, Strategy

_local = threading.local()
_global_strategy: list[Any] = []  # experimental_set_strategy: [strategy] or []


@dataclass
class Frame:
    strategy: Strategy
    replica_context: ReplicaContext | None  # None: cross-replica context


def _stack() -> list[Frame]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def current_frame() -> Frame | None:
    stack = _stack()
    if stack:
        return stack[-1]
    if _global_strategy:
        return Frame(_global_strategy[0], None)
    return None


def push(frame: Frame) -> None:
    _stack().append(frame)


def pop(frame: Frame) -> None:
    stack = _stack()
    if not stack or stack[-1] is not frame:
        raise RuntimeError(
            "strategy contexts were exited out of order (a scope() entered in "
            "one place was exited in another)"
        )
    stack.pop()


def unwind(frame: Frame) -> None:
    """Drops ``frame`` and every frame pushed above it (scopes a function entered and never
    left), so that a thread that lives on starts its next task clean."""
    stack = _stack()
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is frame:
            del stack[i:]
            return


# Set by strategy.py when it loads (this module sits below it and must not import it).
_default_strategy_factory: list[Callable[[], Strategy]] = []


def register_default_strategy(factory: Callable[[], Strategy]) -> None:
    """Names the function that returns the default strategy (one replica, this thread)."""
    _default_strategy_factory[:] = [factory]


def default_strategy() -> Strategy:
    if not _default_strategy_factory:
        raise RuntimeError(
            "no default strategy: import pycollective.strategies, not "
            "pycollective.strategies._context alone"
        )
    return _default_strategy_factory[0]()


def get_strategy() -> Strategy:
    """Returns the current Strategy: the one whose scope() (or run()) this thread is in, else
    the default strategy (one replica)."""
    frame = current_frame()
    return frame.strategy if frame is not None else default_strategy()


def has_strategy() -> bool:
    """Returns whether there is a current non-default Strategy."""
    frame = current_frame()
    return frame is not None and frame.strategy is not default_strategy()


def get_replica_context() -> ReplicaContext | None:
    """Returns the current ReplicaContext, or None in a cross-replica context.

    Inside ``strategy.run`` this is the replica's context; inside ``strategy.scope()`` (and in
    ``merge_call``'s ``merge_fn``) it is None; with no strategy at all it is the default
    strategy's replica context (replica 0 of 1).
    """
    frame = current_frame()
    if frame is None:
        return default_strategy().extended._default_replica_context
    return frame.replica_context


def in_cross_replica_context() -> bool:
    """Returns True in a cross-replica context (inside scope() but not inside run())."""
    frame = current_frame()
    return frame is not None and frame.replica_context is None


def experimental_set_strategy(strategy: Strategy | None) -> None:
    """Makes ``strategy`` current for every thread without ``with strategy.scope()``; None
    clears it."""
    if strategy is None:
        _global_strategy.clear()
        return
    if _stack():
        raise RuntimeError("experimental_set_strategy must be called outside any scope()")
    _global_strategy[:] = [strategy]
