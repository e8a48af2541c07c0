"""Mutual TLS on every gRPC server and channel pycollective opens (the coordination service, the
grpc data plane, parameter-server tasks), when ``PYCOLLECTIVE_TLS_CERT``, ``PYCOLLECTIVE_TLS_KEY``
and ``PYCOLLECTIVE_TLS_CA`` are set (``pycollective run --tls-cert/--tls-key/--tls-ca`` sets them
for every rank).

Each process presents its certificate both as a server and as a client, and accepts a peer only
when the peer's certificate chains to the CA: a client without a certificate, or with one from
another CA, fails the handshake before any call reaches a handler. The cluster token is still
checked on every call (pycollective/rendezvous/auth.py): TLS proves the peer holds a key the
cluster's CA signed and hides the token and the messages from the network; the token says the
peer belongs to this job. Clients verify that the server's certificate names the address they
dial (a subjectAltName IP or DNS entry), as any TLS client does.

Without the three variables every channel is plaintext, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from pycollective import config

_KNOBS = ("PYCOLLECTIVE_TLS_CERT", "PYCOLLECTIVE_TLS_KEY", "PYCOLLECTIVE_TLS_CA")


@dataclass(frozen=True)
class TlsFiles:
    """The PEM contents of this process's certificate chain, its private key and the CA."""

    cert: bytes
    key: bytes
    ca: bytes


def configured() -> TlsFiles | None:
    """The certificate, key and CA named by the PYCOLLECTIVE_TLS_* variables, or None when none
    is set.

    Raises:
        ValueError: Only some of the three are set, or a file cannot be read.
    """
    paths = {name: config.text(name) for name in _KNOBS}
    given = [name for name, path in paths.items() if path]
    if not given:
        return None
    missing = [name for name in _KNOBS if name not in given]
    if missing:
        raise ValueError(
            f"mutual TLS needs a certificate, its key and the CA, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} unset (set: {', '.join(given)}); set all "
            "three (pycollective run --tls-cert/--tls-key/--tls-ca) or none"
        )
    contents = []
    for name in _KNOBS:
        try:
            with open(paths[name], "rb") as f:
                contents.append(f.read())
        except OSError as exc:
            raise ValueError(f"{name}={paths[name]!r} cannot be read: {exc}") from None
    return TlsFiles(*contents)


def add_port(server: grpc.Server, address: str) -> int:
    """Binds ``address`` on ``server``, with mutual TLS when configured. Returns the port (0:
    could not bind, as ``add_insecure_port`` says)."""
    files = configured()
    if files is None:
        return server.add_insecure_port(address)
    credentials = grpc.ssl_server_credentials(
        [(files.key, files.cert)], root_certificates=files.ca, require_client_auth=True
    )
    return server.add_secure_port(address, credentials)


def channel(
    address: str, options: Sequence[tuple[str, Any]] = (), server_name: str | None = None
) -> grpc.Channel:
    """A channel to ``address``, presenting this process's certificate when TLS is configured.

    Args:
        address: ``host:port`` to dial.
        options: gRPC channel options.
        server_name: The name the server's certificate must carry when it differs from the
            host dialed (rank 0 dials its own service at the address it bound, but checks the
            name every other rank checks: the coordinator's).
    """
    files = configured()
    if files is None:
        return grpc.insecure_channel(address, options=list(options))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=files.ca, private_key=files.key, certificate_chain=files.cert
    )
    extra = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(address, credentials, options=list(options) + extra)
