"""Python's side of pycollective's logging, in the native side's format and settings
(csrc/core/logging.h): ``PYCOLLECTIVE_DEBUG=NONE|WARN|INFO|TRACE`` and
``PYCOLLECTIVE_DEBUG_SUBSYS=INIT,COLL,TRANSPORT,TUNING,NCCL,STRATEGIES,PS`` (``ALL``, or
``^LIST`` for all but those). Every line reads
``pycollective[rank R host:pid] LEVEL SUBSYS: message`` on stderr.

Modules log through ``logging.getLogger("pycollective.<...>")``; the logger's name gives the
subsystem (:data:`SUBSYSTEMS`). The handler attached to the ``pycollective`` logger writes only
while the application has configured no root handler: once it has (``logging.basicConfig``,
pytest's caplog), records propagate to it as usual, in its format.
"""

from __future__ import annotations

import logging
import os
import socket
import sys

from pycollective import config
from pycollective._ext import _C

# Logger name prefix -> subsystem; the longest matching prefix wins.
SUBSYSTEMS = {
    "pycollective": "INIT",
    "pycollective.rendezvous": "INIT",
    "pycollective.process_group": "COLL",
    "pycollective.shared_memory": "COLL",
    "pycollective.tuning": "TUNING",
    "pycollective.transports": "TRANSPORT",
    "pycollective.grpc_transport": "TRANSPORT",
    "pycollective.nccl": "NCCL",
    "pycollective.torch": "COLL",
    "pycollective.strategies": "STRATEGIES",
    "pycollective.strategies.parameter_server": "PS",
}
_ALL = {"INIT", "COLL", "TRANSPORT", "TUNING", "NCCL", "STRATEGIES", "PS"}
_LEVELS = {
    "NONE": logging.CRITICAL + 10,
    "WARN": logging.WARNING,
    "INFO": logging.INFO,
    "TRACE": logging.DEBUG,
}
_rank = -1


def subsystem_of(logger_name: str) -> str:
    best = max(
        (p for p in SUBSYSTEMS if logger_name == p or logger_name.startswith(p + ".")),
        key=len,
        default="pycollective",
    )
    return SUBSYSTEMS[best]


def enabled_subsystems(setting: str) -> set[str]:
    """``ALL``, ``A,B`` or ``^A,B`` (all but), case-insensitive, as the native side reads it."""
    setting = setting.strip().upper()
    if setting in ("", "ALL"):
        return set(_ALL)
    except_ = setting.startswith("^")
    named = {s.strip() for s in setting.lstrip("^").split(",") if s.strip()}
    return (_ALL - named) if except_ else (named & _ALL)


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        who = f"rank {_rank} " if _rank >= 0 else ""
        level = {logging.DEBUG: "TRACE", logging.WARNING: "WARN"}.get(
            record.levelno, record.levelname
        )
        prefix = f"pycollective[{who}{socket.gethostname()}:{os.getpid()}]"
        return f"{prefix} {level} {subsystem_of(record.name)}: {record.getMessage()}"


class _SubsystemFilter(logging.Filter):
    """Warnings always pass; INFO and TRACE only for the enabled subsystems."""

    def __init__(self) -> None:
        super().__init__()
        self.enabled = set(_ALL)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or subsystem_of(record.name) in self.enabled


class _Handler(logging.StreamHandler):
    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:  # the application's logging takes over
            return
        super().emit(record)


_handler = _Handler(sys.stderr)
_handler.setFormatter(_Format())
_filter = _SubsystemFilter()
_handler.addFilter(_filter)


def apply_settings() -> None:
    """Reads PYCOLLECTIVE_DEBUG and PYCOLLECTIVE_DEBUG_SUBSYS (from config's snapshot)."""
    root = logging.getLogger("pycollective")
    level = config.text("PYCOLLECTIVE_DEBUG").upper()
    root.setLevel(_LEVELS.get(level, logging.WARNING))
    _filter.enabled = enabled_subsystems(config.text("PYCOLLECTIVE_DEBUG_SUBSYS"))
    if _handler not in root.handlers:
        root.addHandler(_handler)


def set_rank(rank: int) -> None:
    """The rank in every line's prefix, on both sides (called when a group forms)."""
    global _rank
    _rank = int(rank)
    _C.set_log_rank(_rank)


apply_settings()
