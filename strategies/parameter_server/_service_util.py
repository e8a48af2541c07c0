"""What the ps and worker services share: how a handler refuses a request, and how an
optimizer is rebuilt from the state the coordinator sends."""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc

_log = logging.getLogger("pycollective.strategies.parameter_server")


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    context.abort(code, message)


def refuse_payload(context: grpc.ServicerContext, what: str, task: str) -> None:
    _log.warning(
        "%s refused a %s payload from %s: its HMAC does not match (tampered, or signed "
        "with another cluster token); nothing was unpickled",
        task,
        what,
        context.peer(),
    )
    abort(
        context,
        grpc.StatusCode.UNAUTHENTICATED,
        f"{task} refused the {what}: its signature does not match this cluster's token "
        "(tampered message, or another PYCOLLECTIVE_TOKEN)",
    )


def rebuild_optimizer(cls: type, state: dict[str, Any]) -> Any:
    """An instance of the coordinator's optimizer class with its hyperparameters (no strategy,
    no variables): what provides ``_update_step`` and ``_lr`` on the ps."""
    opt = cls.__new__(cls)
    opt.__dict__.update(state)
    opt._lock = threading.Lock()
    opt._strategy = None
    opt._scope_strategy = None
    opt._iterations = None
    opt._slots = {}
    opt._slot_order = []
    return opt
