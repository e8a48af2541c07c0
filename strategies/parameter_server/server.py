"""The tasks of a parameter-server cluster: ``Server(cluster_resolver).join()`` serves a ``ps``
task (:mod:`.ps_service`) or a ``worker`` task (:mod:`.worker_service`); :func:`main` is the
process entry point (``pycollective ps-task``)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import uuid
from concurrent import futures
from typing import Any

import grpc

from pycollective.rendezvous import tls
from pycollective.rendezvous.addresses import server_host
from pycollective.rendezvous.auth import TokenInterceptor
from pycollective.rendezvous.cluster import format_address

from ..cluster_resolver import ClusterResolver, ClusterSpec, TFConfigClusterResolver
from . import ps_pb2_grpc as pb_grpc
from . import wire
from .data_plane import DataPlaneServer
from .ps_service import ParameterServerService
from .worker_service import WorkerService

_log = logging.getLogger("pycollective.strategies.parameter_server")


def _resolve_task(
    server_or_cluster_def: Any, job_name: str | None, task_index: int | None
) -> tuple[ClusterSpec, str, int]:
    if server_or_cluster_def is None:
        server_or_cluster_def = TFConfigClusterResolver()
    if isinstance(server_or_cluster_def, ClusterResolver):
        resolver = server_or_cluster_def
        spec = resolver.cluster_spec()
        job = job_name if job_name is not None else resolver.task_type
        index = task_index if task_index is not None else resolver.task_id
    else:
        spec = ClusterSpec(server_or_cluster_def)
        job, index = job_name, task_index
    if not spec:
        raise ValueError(
            "Server needs a cluster: set TF_CONFIG (with 'ps' and 'worker' jobs), "
            "or pass a ClusterResolver / ClusterSpec"
        )
    if job is None or index is None:
        raise ValueError(
            'Server needs to know which task it is: set TF_CONFIG\'s "task", or '
            "pass job_name and task_index"
        )
    if job not in ("ps", "worker"):
        raise ValueError(
            f"Server runs 'ps' and 'worker' tasks, not {job!r}: the chief runs the "
            "coordinator program (ParameterServerStrategy + ClusterCoordinator)"
        )
    return spec, job, int(index)


class Server:
    """An in-process server for one task of a parameter-server cluster (tf.distribute.Server).

    ``Server(cluster_resolver).join()`` runs a ps or worker task until it is stopped (or
    killed). Tasks take their addresses from the cluster spec; a port of 0 lets the OS choose
    (``address`` then holds the real one).

    Args:
        server_or_cluster_def: a ClusterResolver (default TFConfigClusterResolver()), a
            ClusterSpec or a dict of jobs.
        job_name: "ps" or "worker" (default: the resolver's task type).
        task_index: the task's index in its job (default: the resolver's task id).
        protocol: "grpc" (the only one).
        config: ignored (tf's session config).
        start: start serving now.
        token: the cluster token (default PYCOLLECTIVE_TOKEN); every task of the cluster and
            the coordinator must share it.
        max_workers: threads serving calls (a ps task needs one per waiting worker in
            synchronous training).
    """

    def __init__(
        self,
        server_or_cluster_def: Any = None,
        job_name: str | None = None,
        task_index: int | None = None,
        protocol: str | None = None,
        config: Any = None,
        start: bool = True,
        *,
        token: str | None = None,
        max_workers: int = 32,
    ) -> None:
        if protocol not in (None, "grpc"):
            raise ValueError(f"protocol must be 'grpc', got {protocol!r}")
        self._spec, self.job_name, self.task_index = _resolve_task(
            server_or_cluster_def, job_name, task_index
        )
        self._token = wire.resolve_token(token)
        self._configured = self._spec.task_address(self.job_name, self.task_index)
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._data_plane: DataPlaneServer | None = None
        self._stopped = threading.Event()
        self.incarnation = uuid.uuid4().hex
        self.address = self._configured
        if start:
            self.start()

    @property
    def task(self) -> str:
        return f"/job:{self.job_name}/replica:0/task:{self.task_index}"

    @property
    def data_plane_failures(self) -> list[str]:
        """ps tasks: why each data channel that broke the protocol was closed (oldest first;
        the task went on serving). Empty for worker tasks."""
        return list(self._data_plane.failures) if self._data_plane is not None else []

    @property
    def target(self) -> str:
        """``grpc://host:port`` of this task."""
        return f"grpc://{self.address}"

    def start(self) -> None:
        """Binds the task's address and starts serving."""
        if self._server is not None:
            return
        host, _, port = self._configured.rpartition(":")
        host = host.strip("[]")
        # The task's own address (loopback for a single-host cluster), unless
        # PYCOLLECTIVE_IFNAME asks for another or for all interfaces.
        bind_host = server_host(host)
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self._max_workers, thread_name_prefix=f"pc-{self.job_name}"
            ),
            interceptors=[TokenInterceptor(self._token, self.task)],
            options=wire.server_options(),
        )
        key = wire.payload_key(self._token)
        data_plane = None
        if self.job_name == "ps":
            service = ParameterServerService(key, self.task_index, self.incarnation)
            # Tensor bytes travel over native channels; Ping tells clients the port.
            data_plane = DataPlaneServer(service, self._token, bind_host)
            service.data_port = data_plane.port
            pb_grpc.add_ParameterServerServicer_to_server(service, server)
        else:
            pb_grpc.add_WorkerServicer_to_server(
                WorkerService(key, self._token, self.task_index, self.incarnation), server
            )
        wanted = format_address(bind_host, int(port))
        try:
            bound = tls.add_port(server, wanted)
        except RuntimeError:
            bound = 0
        if bound == 0:
            server.stop(None)
            if data_plane is not None:
                data_plane.stop()
            raise RuntimeError(
                f"{self.task} cannot listen on {wanted}: is the port in use "
                "(another job, or a previous run still exiting)?"
            )
        server.start()
        self._server = server
        self._data_plane = data_plane
        self.address = f"{host}:{bound}"
        _log.info("%s serving on %s", self.task, self.address)

    def join(self, timeout: float | None = None) -> bool:
        """Blocks until the server stops (or ``timeout`` seconds pass: returns False then)."""
        return self._stopped.wait(timeout)

    def stop(self, grace: float | None = None) -> None:
        """Stops serving; calls in flight are cancelled after ``grace`` seconds."""
        server, self._server = self._server, None
        data_plane, self._data_plane = self._data_plane, None
        if data_plane is not None:
            data_plane.stop()
        if server is not None:
            server.stop(grace).wait(timeout=(grace or 0) + 5.0)
        self._stopped.set()

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Server {self.task} on {self.address}>"


def main(argv: list[str] | None = None) -> int:
    """``pycollective ps-task`` (or ``python -m pycollective.strategies.parameter_server``):
    run this process's TF_CONFIG task (ps or worker) until SIGTERM/SIGINT."""
    import argparse

    argparse.ArgumentParser(
        prog="pycollective ps-task",
        description="Runs the ps or worker task that TF_CONFIG's 'task' names (with "
        "PYCOLLECTIVE_TOKEN, the cluster's shared secret) until SIGTERM or SIGINT. "
        "Prints '<task> serving on <address>' once it listens.",
    ).parse_args(argv)
    server = Server(TFConfigClusterResolver())

    def stop(signum: int, frame: Any) -> None:
        server.stop(grace=0.5)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"pycollective.parameter_server: {server.task} serving on {server.address}", flush=True)
    sys.stdout.flush()
    while not server.join(1.0):
        pass
    return 0
