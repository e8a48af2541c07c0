"""TPUClusterResolver: the XLA devices a TPUStrategy runs on, across every process of the job.

With one process it wraps ``jax.devices()`` of this host. Under a launcher (``pycollective run``,
``TF_CONFIG``, torchrun, Open MPI, Slurm: the environments pycollective's process groups read),
it first joins the processes with ``jax.distributed.initialize``, so that ``jax.devices()`` holds
every host's devices and one mesh spans them all.
"""

from __future__ import annotations

import logging
from typing import Any

from pycollective import config as _config
from pycollective.rendezvous.cluster import ClusterSpec as _ProcessSpec
from pycollective.rendezvous.cluster import format_address

from ..cluster_resolver import ClusterResolver, ClusterSpec
from . import _jax

logger = logging.getLogger("pycollective.strategies")

#: JAX's coordination service listens on the job's coordinator port plus this offset, so that it
#: can live beside pycollective's own coordinator (port + 0) and torch's store (torchrun's
#: MASTER_PORT, whose pycollective coordinator is at + 1).
JAX_PORT_OFFSET = 2

_CLOUD_ARGS = ("zone", "project", "service", "discovery_url")


class TPUClusterResolver(ClusterResolver):
    """Cluster Resolver for the XLA devices of this job (TPU cores, GPUs or host CPU devices).

    Args:
        tpu: ``None``, ``""`` or ``"local"`` (the default): the devices JAX sees. On a host
            without TPUs this is the platform JAX picked (GPUs, else CPU devices; see
            ``XLA_FLAGS=--xla_force_host_platform_device_count=N``), and the resolver logs
            which. Cloud TPU names (``"my-tpu"``, ``"grpc://..."``) are not looked up: run the
            program on the TPU VM itself with ``tpu="local"``.
        job_name: the job name used in device strings and ``cluster_spec()``.
        coordinator_address: ``"host:port"`` of JAX's coordination service in a multi-process
            job. Default: the coordinator host of the launcher environment, its port +
            ``JAX_PORT_OFFSET``.
        zone, project, coordinator_name, credentials, service, discovery_url: Cloud TPU lookup
            arguments of tf's resolver; giving zone, project, service or discovery_url is an
            error (there is no Cloud API here).

    Raises:
        ImportError: JAX is not installed (``pip install "pycollective[tpu]"``).
        ValueError: an unsupported ``tpu`` or Cloud argument, or a bad launcher environment.
        RuntimeError: a multi-process job, but JAX was already used in this process before
            the resolver could call ``jax.distributed.initialize``.
    """

    def __init__(
        self,
        tpu: str | None = None,
        zone: str | None = None,
        project: str | None = None,
        job_name: str = "worker",
        coordinator_name: str | None = None,
        coordinator_address: str | None = None,
        credentials: Any = "default",
        service: Any = None,
        discovery_url: str | None = None,
    ) -> None:
        jax = _jax.require()
        if tpu not in (None, "", "local"):
            raise ValueError(
                f"TPUClusterResolver(tpu={tpu!r}): only tpu='local' (the devices "
                "JAX sees in this job) is supported; on a Cloud TPU VM pass "
                "tpu='local' (or nothing) and run the program on every host"
            )
        given = [
            n for n, v in zip(_CLOUD_ARGS, (zone, project, service, discovery_url)) if v is not None
        ]
        if given:
            raise ValueError(
                f"TPUClusterResolver: {', '.join(given)} are Cloud TPU lookup "
                "arguments, which need Google Cloud's API; run on the TPU VM with "
                "tpu='local' instead"
            )
        self.task_type = job_name
        self._job_name = job_name
        # The cluster token authenticates pycollective's own connections; JAX's coordination
        # service does not use it, so a launcher without one (torchrun) is fine here.
        self._process = _ProcessSpec.from_env(
            token=_config.text("PYCOLLECTIVE_TOKEN") or "not-used-by-jax"
        )
        self._coordinator = coordinator_address
        if self._process.world_size > 1:
            self._coordinator = coordinator_address or format_address(
                self._process.master_addr, self._process.master_port + JAX_PORT_OFFSET
            )
            _initialize_distributed(jax, self._coordinator, self._process)
        self.task_id = jax.process_index()
        self.rpc_layer = None
        devices = jax.devices()
        self._platform = devices[0].platform
        if self._platform != "tpu":
            logger.info(
                "TPUClusterResolver: no TPU in this job; using %d %s device(s) "
                "(%d process(es), %d here): %s",
                len(devices),
                self._platform,
                jax.process_count(),
                len(jax.local_devices()),
                ", ".join(str(d) for d in jax.local_devices()),
            )
        else:
            logger.info(
                "TPUClusterResolver: %d TPU cores in %d process(es)",
                len(devices),
                jax.process_count(),
            )

    # What the strategy needs --------------------------------------------------------------------

    @property
    def platform(self) -> str:
        """The XLA platform of the devices: ``"tpu"``, ``"gpu"`` (``"cuda"``/``"rocm"``) or
        ``"cpu"``."""
        return self._platform

    @property
    def devices(self) -> list[Any]:
        """Every device of the job (all processes), process by process."""
        jax = _jax.require()
        return sorted(jax.devices(), key=lambda d: (d.process_index, d.id))

    @property
    def local_devices(self) -> list[Any]:
        """This process's devices."""
        return [d for d in self.devices if d.process_index == self.task_id]

    @property
    def num_processes(self) -> int:
        return _jax.require().process_count()

    # tf.distribute.cluster_resolver.ClusterResolver ------------------------------------------

    def cluster_spec(self) -> ClusterSpec:
        """One ``job_name`` task per process (``{}`` for a single process).

        Only the coordinator's host is known here (JAX's coordination service joins the
        processes; their own addresses are never exchanged), so each task's entry is
        ``"<coordinator host>:<process index>"``: it counts and orders the tasks, it is not an
        address to connect to. Use ``master()`` for the one real address."""
        if self._process.world_size == 1:
            return ClusterSpec({})
        host = self._process.master_addr
        return ClusterSpec(
            {self._job_name: [f"{host}:{i}" for i in range(self._process.world_size)]}
        )

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The address of JAX's coordination service ("" with one process)."""
        return self._coordinator or ""

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        """This process's devices by kind, e.g. ``{"TPU": 8}`` or ``{"CPU": 4}``."""
        return {self._platform.upper(): len(self.local_devices)}

    @property
    def environment(self) -> str:
        return "local"

    def __repr__(self) -> str:
        return (
            f"TPUClusterResolver(platform={self._platform!r}, devices={len(self.devices)}, "
            f"processes={self.num_processes})"
        )


def _initialize_distributed(jax: Any, coordinator: str, spec: _ProcessSpec) -> None:
    if jax.distributed.is_initialized():
        if jax.process_count() != spec.world_size or jax.process_index() != spec.rank:
            raise RuntimeError(
                f"jax.distributed is initialized as process {jax.process_index()} of "
                f"{jax.process_count()}, but the launcher environment ({spec.source}) says "
                f"rank {spec.rank} of {spec.world_size}"
            )
        return
    if _jax.backend_initialized():
        raise RuntimeError(
            f"this is process {spec.rank} of {spec.world_size} ({spec.source}), but JAX was "
            "already used in this process, so jax.distributed.initialize can no longer join the "
            "processes; create the TPUClusterResolver (or TPUStrategy) before any other JAX "
            "call"
        )
    # Cross-process collectives between CPU devices need an implementation (TPUs and GPUs
    # bring their own interconnect); gloo ships with jaxlib.
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    logger.info(
        "TPUClusterResolver: jax.distributed.initialize(%s, %d processes, process %d) from %s",
        coordinator,
        spec.world_size,
        spec.rank,
        spec.source,
    )
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=spec.world_size, process_id=spec.rank
    )
