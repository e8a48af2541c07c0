"""The one way pycollective gets a TCP port: bind to port 0 and report what the OS gave.

A listener of pycollective's own binds port 0 itself and reports the port it got: the data
links' listeners (through the coordinator's peer table), the gRPC data plane, rank 0's
coordinator under ``init(announce=)``.

When the listener is a process that starts later, and others must be told its port before it
runs (a launcher's ranks and ps tasks, torch's env:// store, a benchmark's peers), the parent
binds port 0 and *holds* that socket until the job ends: bound but never listening, with
``SO_REUSEADDR`` and ``SO_REUSEPORT``. Meanwhile the OS hands the port to nobody else (a bind to
port 0 skips ports in use; a plain bind to it fails), and the child's listener still binds it,
because no socket listens there: gRPC (with or without ``grpc.so_reuseport``), torch's TCPStore
and TensorFlow's servers all set ``SO_REUSEADDR``. Picking a free port and closing it before
the child binds it (the usual way) leaves a window in which another process can take it.
"""

from __future__ import annotations

import socket
from types import TracebackType


class PortReservation:
    """``count`` distinct ports chosen by the OS on ``host``, held until :meth:`close`.

    Use as a context manager around the life of the processes that listen on the ports::

        with PortReservation(2) as reserved:
            coordinator, store = reserved.ports
            ...start the processes, wait for them...
    """

    def __init__(self, count: int, host: str = "127.0.0.1") -> None:
        self._sockets: list[socket.socket] = []
        try:
            for _ in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if hasattr(socket, "SO_REUSEPORT"):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind((host, 0))
        except BaseException:
            self.close()
            raise
        #: the ports, in the order asked for
        self.ports: list[int] = [s.getsockname()[1] for s in self._sockets]

    def close(self) -> None:
        """Releases the ports (call once the processes that listen on them are gone)."""
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
