"""The cluster token on gRPC servers: one interceptor for every service pycollective hosts (the
coordination service, the grpc data plane, parameter-server tasks)."""

from __future__ import annotations

import hmac
import logging

import grpc

from .client import TOKEN_METADATA_KEY

_log = logging.getLogger("pycollective.rendezvous")


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses (UNAUTHENTICATED, logged) any call without the cluster token, before a handler
    runs. ``what`` names the server in the refusal ("the coordinator", "/job:ps/replica:0/task:1")."""

    def __init__(self, token: str, what: str) -> None:
        self._token = token.encode("utf-8")
        self._what = what

    def intercept_service(self, continuation, handler_call_details):
        problem = "it carried no token"
        for key, value in handler_call_details.invocation_metadata or ():
            if key == TOKEN_METADATA_KEY:
                given = value.encode("utf-8") if isinstance(value, str) else value
                # Constant-time: the comparison must not leak the token's prefix.
                if hmac.compare_digest(given, self._token):
                    return continuation(handler_call_details)
                problem = "its token is wrong"
                break
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return _refusal(handler, handler_call_details.method, problem, self._what)


def _refusal(
    handler: grpc.RpcMethodHandler, method: str, problem: str, what: str
) -> grpc.RpcMethodHandler:
    """A handler of the same kind (unary or streaming) as ``handler`` that answers
    UNAUTHENTICATED without reading the request."""
    message = (
        f"{what} refused {method.rsplit('/', 1)[-1]}: {problem} (metadata "
        f"{TOKEN_METADATA_KEY}; every rank and task needs the same PYCOLLECTIVE_TOKEN)"
    )

    def refuse(request_or_iterator, context):
        _log.warning("%s refused %s from %s: %s", what, method, context.peer(), problem)
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    def refuse_stream(request_or_iterator, context):
        refuse(request_or_iterator, context)
        yield  # unreachable: refuse() raises; this makes a generator

    kinds = {
        (False, False): (grpc.unary_unary_rpc_method_handler, refuse),
        (False, True): (grpc.unary_stream_rpc_method_handler, refuse_stream),
        (True, False): (grpc.stream_unary_rpc_method_handler, refuse),
        (True, True): (grpc.stream_stream_rpc_method_handler, refuse_stream),
    }
    make, behaviour = kinds[(bool(handler.request_streaming), bool(handler.response_streaming))]
    # No request deserializer: the request stays raw bytes, never parsed, so that a malformed
    # one from an unauthenticated caller is refused as such too (not answered INTERNAL by a
    # parse error before the refusal runs).
    return make(behaviour, request_deserializer=None, response_serializer=None)
