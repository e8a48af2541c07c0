"""Cluster resolvers: where the workers of a multi-worker job are (tf.distribute.cluster_resolver).

:class:`TFConfigClusterResolver` reads the ``TF_CONFIG`` environment variable, e.g.::

    TF_CONFIG='{"cluster": {"worker": ["host0:2222", "host1:2222"]},
                "task": {"type": "worker", "index": 0}}'

Like TensorFlow's, it re-reads TF_CONFIG on every call and never fails in its constructor;
unlike TensorFlow's, every malformed TF_CONFIG (bad JSON, a missing "task", an index out of
range, ...) raises ValueError saying what is wrong and showing the expected shape.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

_EXAMPLE = (
    '{"cluster": {"worker": ["host0:2222", "host1:2222"]}, "task": {"type": "worker", "index": 0}}'
)


def _error(problem: str) -> ValueError:
    return ValueError(
        f"TF_CONFIG {problem}. Expected a JSON object like TF_CONFIG='{_EXAMPLE}' "
        '(jobs "chief" and "worker" form the collective group; "task" names this '
        "process)"
    )


class ClusterSpec:
    """Jobs and their task addresses: ``{"worker": ["host0:2222", "host1:2222"], ...}``
    (a job may also map task indices to addresses, as tf allows)."""

    def __init__(self, cluster: Mapping[str, Any] | ClusterSpec | None = None) -> None:
        if isinstance(cluster, ClusterSpec):
            cluster = cluster.as_dict()
        self._jobs: dict[str, dict[int, str]] = {}
        for job, tasks in (cluster or {}).items():
            if not isinstance(job, str):
                raise _error(f"has a job name {job!r} that is not a string")
            if isinstance(tasks, (list, tuple)):
                mapping = dict(enumerate(tasks))
            elif isinstance(tasks, dict):
                try:
                    mapping = {int(k): v for k, v in tasks.items()}
                except (TypeError, ValueError):
                    raise _error(
                        f'"cluster.{job}" maps task indices to addresses but has a key '
                        "that is not an integer"
                    ) from None
            else:
                raise _error(
                    f'"cluster.{job}" must be a list of "host:port" strings, got '
                    f"{type(tasks).__name__}"
                )
            for index, address in mapping.items():
                if not isinstance(address, str) or ":" not in address:
                    raise _error(
                        f'"cluster.{job}"[{index}] must be a "host:port" string, got {address!r}'
                    )
            self._jobs[job] = dict(sorted(mapping.items()))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for job, tasks in self._jobs.items():
            if list(tasks) == list(range(len(tasks))):
                out[job] = list(tasks.values())
            else:
                out[job] = dict(tasks)
        return out

    @property
    def jobs(self) -> list[str]:
        return list(self._jobs)

    def num_tasks(self, job_name: str) -> int:
        return len(self._job(job_name))

    def task_indices(self, job_name: str) -> list[int]:
        return list(self._job(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        tasks = self._job(job_name)
        if task_index not in tasks:
            raise ValueError(
                f"No task with index {task_index} in job {job_name!r} (it has tasks {list(tasks)})"
            )
        return tasks[task_index]

    def job_tasks(self, job_name: str) -> list[str]:
        return list(self._job(job_name).values())

    def _job(self, job_name: str) -> dict[int, str]:
        if job_name not in self._jobs:
            raise ValueError(f"No such job in cluster: {job_name!r} (jobs: {self.jobs})")
        return self._jobs[job_name]

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterSpec) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        return f"ClusterSpec({self.as_dict()!r})"


class ClusterResolver:
    """Abstract class for all implementations of ClusterResolvers."""

    task_type: str | None = None
    task_id: int | None = None
    rpc_layer: str | None = None

    def cluster_spec(self) -> ClusterSpec:
        raise NotImplementedError

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        raise NotImplementedError

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        """Accelerators per type on the task: none (CPU replicas)."""
        return defaultdict(int)

    @property
    def environment(self) -> str:
        return ""


class SimpleClusterResolver(ClusterResolver):
    """Simple implementation of ClusterResolver that accepts all attributes."""

    def __init__(
        self,
        cluster_spec: ClusterSpec | Mapping[str, Any],
        master: str = "",
        task_type: str | None = None,
        task_id: int | None = None,
        environment: str = "",
        num_accelerators: dict[str, int] | None = None,
        rpc_layer: str | None = None,
    ) -> None:
        self._cluster_spec = ClusterSpec(cluster_spec)
        self._master = master
        self.task_type = task_type
        self.task_id = task_id
        self._environment = environment
        self._num_accelerators = num_accelerators or {}
        self.rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        return self._cluster_spec

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        if task_type is not None and task_id is not None:
            address = self._cluster_spec.task_address(task_type, task_id)
            layer = rpc_layer or self.rpc_layer
            return f"{layer}://{address}" if layer else address
        return self._master

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        return defaultdict(int, self._num_accelerators)

    @property
    def environment(self) -> str:
        return self._environment


class TFConfigClusterResolver(ClusterResolver):
    """Implementation of a ClusterResolver which reads the TF_CONFIG EnvVar.

    Args:
        task_type: overrides TF_CONFIG's ``task.type``.
        task_id: overrides TF_CONFIG's ``task.index``.
        rpc_layer: overrides TF_CONFIG's ``rpc_layer``.
        environment: overrides TF_CONFIG's ``environment``.

    Without TF_CONFIG the cluster is empty: a single worker.
    """

    def __init__(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        environment: str | None = None,
    ) -> None:
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._environment = environment

    # TF_CONFIG ---------------------------------------------------------------------------------

    @staticmethod
    def _load() -> dict[str, Any]:
        raw = os.environ.get("TF_CONFIG", "")
        if not raw.strip():
            return {}
        try:
            config = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _error(f"is not valid JSON ({exc})") from None
        if not isinstance(config, dict):
            raise _error(f"must be a JSON object, got {type(config).__name__}")
        return config

    def _task(self) -> tuple[str | None, int | None]:
        """(type, index) from TF_CONFIG, validated against its cluster; (None, None) without
        TF_CONFIG."""
        config = self._load()
        spec = self.cluster_spec()
        if not config and self._task_type is None:
            return None, self._task_id
        task = config.get("task")
        if task is None and (self._task_type is None or self._task_id is None):
            if not spec:
                return self._task_type, self._task_id
            raise _error('has a "cluster" but no "task" saying which task this process is')
        if task is not None and not isinstance(task, dict):
            raise _error(f'"task" must be an object with "type" and "index", got {task!r}')
        task = task or {}
        task_type = self._task_type if self._task_type is not None else task.get("type")
        raw_index = self._task_id if self._task_id is not None else task.get("index", 0)
        if not isinstance(task_type, str) or not task_type:
            raise _error(f'"task.type" must be a job name such as "worker", got {task_type!r}')
        if isinstance(raw_index, str) and raw_index.strip().isdigit():
            raw_index = int(raw_index)
        if isinstance(raw_index, bool) or not isinstance(raw_index, int) or raw_index < 0:
            raise _error(f'"task.index" must be a non-negative integer, got {raw_index!r}')
        if spec:
            if task_type not in spec.jobs:
                raise _error(
                    f'says this process is task "{task_type}" #{raw_index}, but '
                    f'"cluster" has no job "{task_type}" (jobs: {spec.jobs})'
                )
            if raw_index not in spec.task_indices(task_type):
                raise _error(
                    f'says this process is task "{task_type}" #{raw_index}, but '
                    f'"cluster.{task_type}" has {spec.num_tasks(task_type)} task(s) '
                    f"(indices {spec.task_indices(task_type)}): index out of range"
                )
        return task_type, raw_index

    # ClusterResolver API -----------------------------------------------------------------------

    def cluster_spec(self) -> ClusterSpec:
        """Returns a ClusterSpec based on the TF_CONFIG environment variable (empty without
        one)."""
        config = self._load()
        cluster = config.get("cluster", {})
        if not isinstance(cluster, dict):
            raise _error(
                f'"cluster" must be an object mapping job names to address lists, got '
                f"{type(cluster).__name__}"
            )
        return ClusterSpec(cluster)

    @property
    def task_type(self) -> str | None:  # type: ignore[override]
        return self._task()[0]

    @task_type.setter
    def task_type(self, value: str | None) -> None:
        self._task_type = value

    @property
    def task_id(self) -> int | None:  # type: ignore[override]
        return self._task()[1]

    @task_id.setter
    def task_id(self, value: int | None) -> None:
        self._task_id = value

    @property
    def rpc_layer(self) -> str | None:  # type: ignore[override]
        if self._rpc_layer is not None:
            return self._rpc_layer
        return self._load().get("rpc_layer")

    @rpc_layer.setter
    def rpc_layer(self, value: str | None) -> None:
        self._rpc_layer = value

    @property
    def environment(self) -> str:
        if self._environment is not None:
            return self._environment
        return self._load().get("environment", "")

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """Returns the master address: '' for a cluster of at most one task, else
        ``rpc_layer://host:port`` (or ``host:port``) of the task."""
        config = self._load()
        if "session_master" in config:
            return config["session_master"]
        spec = self.cluster_spec()
        if task_type is None or task_id is None:
            task_type, task_id = self._task()
        if task_type is None or task_id is None:
            return ""
        if sum(spec.num_tasks(j) for j in spec.jobs) <= 1:
            return ""
        address = spec.task_address(task_type, task_id)
        layer = rpc_layer or self.rpc_layer
        return f"{layer}://{address}" if layer else address

    def validate(self) -> None:
        """Raises ValueError when TF_CONFIG is malformed (what the strategy calls first)."""
        self.cluster_spec()
        self._task()


def collective_members(spec: ClusterSpec) -> list[tuple[str, int]]:
    """The tasks that form the collective group, in rank order: the chief, then the workers."""
    members: list[tuple[str, int]] = []
    for job in ("chief", "worker"):
        if job in spec.jobs:
            members.extend((job, i) for i in spec.task_indices(job))
    return members
