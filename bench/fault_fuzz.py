"""A fuzzer of the gRPC control plane: malformed, truncated, oversized and replayed requests,
with the right token, a wrong one or none, against a live coordination service.

Every input is one call of a coordination method with raw request bytes (``generate``): a valid
protobuf with random field values, one cut short, one with bytes flipped, random garbage, one
larger than gRPC's default message limit, or a replay of an earlier one. What must hold
(``fuzz_control_plane`` counts each):

- every call is answered by its deadline (no handler hangs; a loaded machine gets 5 s of slack)
  and no handler raises (an unexpected exception answers UNKNOWN);
- no call without the right token is accepted (it gets UNAUTHENTICATED, or the transport
  refuses it: RESOURCE_EXHAUSTED for an oversized message) and none changes the group: no
  registration, no abort, no key;
- the service still serves a rank of the group afterwards (a barrier between two real clients).

Used by tests/test_fault_suite.py (a few thousand inputs) and bench/fault_soak.py (>= 100,000).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass

import grpc

from pycollective.rendezvous import CoordinationClient, CoordinationService
from pycollective.rendezvous import coordination_pb2 as pb
from pycollective.rendezvous.client import TOKEN_METADATA_KEY

_SERVICE = "/pycollective.rendezvous.Coordination/"
# Methods a fuzzed input may call with the right token: those that cannot end the group on
# purpose, with their request types. (Abort and Leave end it by design; so does a Heartbeat of
# a rank that then falls silent, which the service must read as that rank's failure.)
AUTHENTICATED = {
    "Register": pb.RegisterRequest,
    "Barrier": pb.BarrierRequest,
    "Set": pb.SetRequest,
    "Get": pb.GetRequest,
    "Add": pb.AddRequest,
}
# Without the token every method is tried, the group-ending ones too: none may act.
UNAUTHENTICATED = {
    **AUTHENTICATED,
    "Heartbeat": pb.HeartbeatRequest,
    "Abort": pb.AbortRequest,
    "Leave": pb.LeaveRequest,
    "WatchAbort": pb.WatchAbortRequest,
}
KINDS = ("valid", "truncated", "flipped", "garbage", "oversized", "replayed")
# Oversized inputs are rare: each moves 4 MiB (a quarter of a second on a loaded machine).
_WEIGHTS = (20, 20, 20, 20, 1, 19)
_OVERSIZED = 4 * 1024 * 1024 + 1  # gRPC's default largest message, plus one byte


# How a call without the right token may end: refused by the token check, refused by the
# transport (a message over the limit), or given up by the caller while queued.
_REFUSED = ("UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")


@dataclass
class Input:
    method: str
    kind: str
    payload: bytes
    token: str | None  # None: no token metadata


def _random_message(rng: random.Random, cls) -> bytes:
    msg = cls()
    for f in cls.DESCRIPTOR.fields:
        if f.message_type is not None:
            continue  # maps (endpoints) stay empty
        if f.type in (f.TYPE_INT32, f.TYPE_INT64, f.TYPE_SINT32, f.TYPE_SINT64):
            limit = 2**31 - 1 if f.type in (f.TYPE_INT32, f.TYPE_SINT32) else 2**63 - 1
            value = rng.choice((0, 1, 3, -1, limit, -limit - 1, rng.randint(-limit, limit)))
            setattr(msg, f.name, value)
        elif f.type in (f.TYPE_UINT32, f.TYPE_UINT64):
            setattr(msg, f.name, rng.choice((0, 1, 2**32 - 1)))
        elif f.type == f.TYPE_STRING:
            setattr(
                msg, f.name, "".join(chr(rng.randint(1, 0x2FF)) for _ in range(rng.randint(0, 40)))
            )
        elif f.type == f.TYPE_BYTES:
            setattr(msg, f.name, rng.randbytes(rng.randint(0, 200)))
        elif f.type == f.TYPE_BOOL:
            setattr(msg, f.name, rng.random() < 0.5)
    return msg.SerializeToString()


def generate(rng: random.Random, token: str, history: list[Input], authenticated: bool) -> Input:
    """One fuzzed call: method, kind of damage, raw request bytes, and the token it carries
    (``token`` when ``authenticated``, else none or a wrong one)."""
    carries = token if authenticated else rng.choice((None, token[:-1] + "x", ""))
    methods = AUTHENTICATED if carries == token else UNAUTHENTICATED
    method = rng.choice(sorted(methods))
    kind = rng.choices(KINDS, _WEIGHTS)[0]
    valid = _random_message(rng, methods[method])
    if kind == "valid":
        payload = valid
    elif kind == "truncated":
        payload = valid[: rng.randint(0, max(0, len(valid) - 1))]
    elif kind == "flipped":
        payload = bytearray(valid or b"\x00")
        for _ in range(rng.randint(1, 4)):
            payload[rng.randrange(len(payload))] ^= rng.randint(1, 255)
        payload = bytes(payload)
    elif kind == "garbage":
        payload = rng.randbytes(rng.randint(0, 300))
    elif kind == "oversized":
        payload = b"\x0a" + b"\xff\xff\xff\x01" + bytes(_OVERSIZED)  # field 1, ~4 MiB long
    else:
        earlier = [h for h in history if h.method in methods] or [Input(method, kind, valid, None)]
        pick = rng.choice(earlier)
        return Input(pick.method, kind, pick.payload, carries)
    return Input(method, kind, payload, carries)


def fuzz_control_plane(inputs: int, seed: int = 0, deadline_s: float = 0.1) -> dict:
    """Runs ``inputs`` fuzzed calls against a fresh service of a 2-rank group; returns the
    counts (see the module docstring), with "violations" listing what broke a rule."""
    rng = random.Random(seed)
    token = f"fuzz-{rng.getrandbits(64):016x}"
    service = CoordinationService(2, token, host="127.0.0.1")
    address = service.start()
    channel = grpc.insecure_channel(
        address,
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
    )
    counts: Counter[str] = Counter()
    violations: list[str] = []
    history: list[Input] = []
    slowest = 0.0
    started = time.monotonic()
    try:
        for i in range(inputs):
            # The first half without the right token, then the group's own (bad) requests:
            # after the first half nothing of the group may have changed.
            if i == inputs // 2:
                changed = _changed_by_strangers(service)
                if changed:
                    violations.append(changed)
            case = generate(rng, token, history, authenticated=i >= inputs // 2)
            if len(history) < 64:
                history.append(case)
            else:
                history[rng.randrange(64)] = case
            metadata = () if case.token is None else ((TOKEN_METADATA_KEY, case.token),)
            streaming = case.method == "WatchAbort"
            make = channel.unary_stream if streaming else channel.unary_unary
            call = make(_SERVICE + case.method)  # raw bytes in and out
            sent = time.monotonic()
            # A 4 MiB message takes a while to cross a loaded machine's loopback.
            wait = deadline_s * (10 if case.kind == "oversized" else 1)
            try:
                answer = call(case.payload, timeout=wait, metadata=metadata)
                if streaming:
                    list(answer)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            took = time.monotonic() - sent
            counts[f"{'auth' if case.token == token else 'noauth'}:{code}"] += 1
            slowest = max(slowest, took)
            # A hang, not a slow answer on a loaded machine (the client's own deadline bounds
            # the wait; a starved client process can still see it late).
            if took > wait + 5.0:
                violations.append(f"{case.method} ({case.kind}) answered after {took:.2f} s")
            if code == "UNKNOWN":  # a handler raised: the service did not expect this input
                violations.append(f"{case.method} ({case.kind}) made a handler raise")
            if case.token != token and code not in _REFUSED:
                violations.append(
                    f"{case.method} ({case.kind}) without the right token was answered {code}"
                )
        state = service._state
        with state.cond:
            if state.aborted is not None:
                violations.append(f"the group was aborted: {state.aborted.reason}")
        # The service still works for the group's own ranks.
        served = _still_serves(address, token)
        if served:
            violations.append(served)
    finally:
        channel.close()
        service.stop(grace=0)
    return {
        "inputs": inputs,
        "seconds": time.monotonic() - started,
        "answers": dict(sorted(counts.items())),
        "slowest answer s": round(slowest, 3),
        "violations": violations,
    }


def _changed_by_strangers(service: CoordinationService) -> str:
    """ "" when the group's state is as it started: no rank, key, barrier, heartbeat or abort."""
    s = service._state
    with s.cond:
        touched = {
            "registered ranks": sorted(s.peers),
            "keys": sorted(s.kv)[:5],
            "barriers": sorted(name for name, b in s.barriers.items() if b.arrived)[:5],
            "heartbeats": sorted(s.last_heartbeat),
            "left": sorted(s.left),
            "abort": s.aborted.reason if s.aborted is not None else None,
        }
    changed = {k: v for k, v in touched.items() if v}
    return f"calls without the right token changed the group: {changed}" if changed else ""


def _still_serves(address: str, token: str) -> str:
    """ "" when two real clients can still meet at a barrier, else what failed."""
    import secrets
    import threading

    clients = [CoordinationClient(address, r, token, timeout=5) for r in range(2)]
    name = "after-fuzz-" + secrets.token_hex(4)  # a name no fuzzed input used
    errors: list[str] = []

    def meet(c: CoordinationClient) -> None:
        try:
            c.barrier(name, timeout=5)
        except Exception as exc:  # noqa: BLE001 - reported
            errors.append(f"{type(exc).__name__}: {exc}")

    try:
        if clients[0].add("after-fuzz-counter", 1) < 1:
            return "add() stopped counting after the fuzz"
        threads = [threading.Thread(target=meet, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        return f"after the fuzz, both ranks could not meet at a barrier: {errors}" if errors else ""
    finally:
        for c in clients:
            c.close()
