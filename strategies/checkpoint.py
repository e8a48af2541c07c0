"""Checkpoint: variables and optimizer state in one numpy ``.npz`` file.

Objects are tracked by name, like ``tf.train.Checkpoint(model=..., optimizer=...)``: a
variable's key is its path from the checkpoint (``"w"``, ``"model/dense/kernel"``), found by
walking dicts, lists, tuples and the public attributes of plain objects. An optimizer's state
goes under its own path: ``"<opt>/iterations"`` and ``"<opt>/slots/<variable path>/<slot>"``.

Mirrored variables are saved once (the copies are identical); sync-on-read variables are saved
aggregated. Restoring assigns in a cross-replica context, so a checkpoint written with N
replicas restores under any number of replicas (a SUM sync-on-read value is spread evenly).

Files are written atomically (a temporary file in the same folder, fsync, ``os.replace``) and
read with ``allow_pickle=False``: nothing is ever unpickled.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _context
from .optimizers import Optimizer
from .variables import DistributedVariable

FORMAT = "pycollective.strategies.Checkpoint/1"
_FORMAT_KEY = "_CHECKPOINT_FORMAT"
_COUNTER_KEY = "_CHECKPOINT_SAVE_COUNTER"
_KEY_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


class CheckpointLoadStatus:
    """What a restore matched.

    Attributes:
        restored: keys restored.
        unused: keys in the file that no tracked object took.
        missing: tracked variables (and optimizer state) the file had no value for.
    """

    def __init__(self, restored: list[str], unused: list[str], missing: list[str]) -> None:
        self.restored = restored
        self.unused = unused
        self.missing = missing

    def assert_consumed(self) -> CheckpointLoadStatus:
        """Raises AssertionError unless every value in the file was restored and every tracked
        object got a value."""
        if self.unused or self.missing:
            raise AssertionError(
                f"checkpoint not fully consumed: unused values {self.unused}, "
                f"objects without a value {self.missing}"
            )
        return self

    def assert_existing_objects_matched(self) -> CheckpointLoadStatus:
        """Raises AssertionError if a tracked object got no value."""
        if self.missing:
            raise AssertionError(f"objects without a value in the checkpoint: {self.missing}")
        return self

    def expect_partial(self) -> CheckpointLoadStatus:
        """Silences nothing (there are no warnings); returns self for tf compatibility."""
        return self

    def __repr__(self) -> str:
        return (
            f"CheckpointLoadStatus(restored={len(self.restored)}, unused={self.unused}, "
            f"missing={self.missing})"
        )


class Checkpoint:
    """Groups variables and optimizers to save and restore together.

    ``Checkpoint(model=model, optimizer=opt, step=step_var)``: keyword names become the
    top-level keys. ``save(prefix)`` writes ``<prefix>-<n>.npz`` (n counts saves, as tf's
    ``save_counter``) and returns the path; ``write(path)`` writes exactly ``path``;
    ``restore(path)`` reads either.
    """

    def __init__(self, root: Any = None, **kwargs: Any) -> None:
        for name in kwargs:
            _check_key(name)
        self._objects: dict[str, Any] = dict(kwargs)
        if root is not None:
            self._objects["root"] = root
        self.save_counter = 0

    # Saving ------------------------------------------------------------------------------------

    def save(self, file_prefix: str, options: Any = None) -> str:
        """Saves to ``<file_prefix>-<save_counter>.npz``; returns that path. In a multi-worker
        job every worker must call it (sync-on-read values are aggregated with collectives);
        only the chief writes."""
        self.save_counter += 1
        path = f"{os.fspath(file_prefix)}-{self.save_counter}.npz"
        return self.write(path)

    def write(self, file_path: str, options: Any = None) -> str:
        """Writes the tracked state to exactly ``file_path`` (atomically); returns it."""
        _require_cross_replica("save")
        file_path = os.fspath(file_path)
        variables, optimizers = self._track()
        arrays: dict[str, np.ndarray] = {
            _FORMAT_KEY: np.array(FORMAT),
            _COUNTER_KEY: np.array(self.save_counter, dtype=np.int64),
        }
        var_paths = {id(v): p for p, v in variables.items()}
        for opt in optimizers.values():
            opt.iterations  # noqa: B018 - binds an optimizer not used yet to its strategy
        writes = _should_write(variables, optimizers)
        # Every worker computes every value (some are collectives: sync-on-read variables,
        # sharded optimizer slots); only the writer keeps them, so a worker that does not
        # write holds one gathered slot at a time.
        for path, var in variables.items():
            value = var._checkpoint_value()
            if writes:
                arrays[path] = value
        for path, opt in optimizers.items():
            for key, value in _optimizer_state(path, opt, var_paths):
                if writes:
                    arrays[key] = value
        if writes:
            _atomic_savez(file_path, arrays)
        return file_path

    # Restoring ---------------------------------------------------------------------------------

    def restore(self, save_path: str, options: Any = None) -> CheckpointLoadStatus:
        """Restores the tracked state from ``save_path`` (as returned by save or write).

        Shapes must match (ValueError otherwise); the number of replicas may differ from the
        one that wrote the file. Optimizer slots are created as needed.
        """
        _require_cross_replica("restore")
        save_path = os.fspath(save_path)
        if not os.path.exists(save_path) and os.path.exists(save_path + ".npz"):
            save_path += ".npz"
        with np.load(save_path, allow_pickle=False) as data:
            stored = {k: data[k] for k in data.files}
        fmt = stored.pop(_FORMAT_KEY, None)
        if fmt is None or str(fmt) != FORMAT:
            raise ValueError(
                f"{save_path} is not a pycollective.strategies checkpoint "
                f"(format {fmt!r}, expected {FORMAT!r})"
            )
        counter = stored.pop(_COUNTER_KEY, None)
        variables, optimizers = self._track()
        restored: list[str] = []
        missing: list[str] = []
        for path, var in variables.items():
            if path in stored:
                var._restore(stored[path])
                restored.append(path)
            else:
                missing.append(path)
        by_path = dict(variables)
        for path, opt in optimizers.items():
            _restore_optimizer(path, opt, stored, by_path, restored, missing)
        if counter is not None:
            self.save_counter = int(counter)
        unused = sorted(set(stored) - set(restored))
        return CheckpointLoadStatus(restored, unused, missing)

    def read(self, save_path: str, options: Any = None) -> CheckpointLoadStatus:
        """Same as restore (tf's counterpart of write)."""
        return self.restore(save_path, options)

    # Tracking ----------------------------------------------------------------------------------

    def _track(self) -> tuple[dict[str, DistributedVariable], dict[str, Optimizer]]:
        variables: dict[str, DistributedVariable] = {}
        optimizers: dict[str, Optimizer] = {}
        seen: set[int] = set()
        for name, obj in self._objects.items():
            _walk(obj, name, variables, optimizers, seen, depth=0)
        return variables, optimizers


def latest_checkpoint(checkpoint_dir: str, prefix: str = "") -> str | None:
    """The path of the newest ``<prefix>-<n>.npz`` in ``checkpoint_dir`` (largest n), or
    None."""
    best: tuple[int, str] | None = None
    pattern = re.compile(re.escape(prefix) + r".*-(\d+)\.npz$" if prefix else r".*-(\d+)\.npz$")
    try:
        names = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return None
    for name in names:
        m = pattern.match(name)
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), os.path.join(checkpoint_dir, name))
    return best[1] if best else None


class NumberedCheckpoints:
    """Numbered checkpoints ``<directory>/<prefix>-<n>.npz`` of one Checkpoint: the file of a
    number, the numbers on disk, saving one and pruning the oldest beyond ``keep``. Shared by
    the fault-tolerance handlers (fault_tolerance.py) and the ClusterCoordinator's periodic
    checkpoints (parameter_server/recovery.py)."""

    def __init__(self, checkpoint: Checkpoint, directory: str, prefix: str, keep: int) -> None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"expected a pycollective.strategies.Checkpoint, got {type(checkpoint).__name__}"
            )
        if keep < 1:
            raise ValueError(f"keep must be >= 1 checkpoint, got {keep}")
        _check_key(prefix)
        self.checkpoint = checkpoint
        self.directory = os.fspath(directory)
        self.prefix = prefix
        self.keep = keep
        self._pattern = re.compile(re.escape(prefix) + r"-(\d+)\.npz$")

    def strategy(self) -> Any:
        """The strategy of the tracked variables."""
        variables, _ = self.checkpoint._track()
        if not variables:
            raise ValueError("the checkpoint tracks no variables: nothing to back up")
        return next(iter(variables.values())).distribute_strategy

    def path(self, step: int) -> str:
        return os.path.join(self.directory, f"{self.prefix}-{step}.npz")

    def steps_on_disk(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := self._pattern.match(n)))

    def save(self, step: int) -> str:
        """Writes checkpoint ``step`` (atomically), then removes all but the ``keep`` newest.
        In a multi-worker job every worker calls it (values may be collectives); the chief
        writes and prunes."""
        path = self.checkpoint.write(self.path(step))
        if self.strategy().extended.should_checkpoint:
            for old in self.steps_on_disk()[: -self.keep]:
                try:
                    os.unlink(self.path(old))
                except FileNotFoundError:
                    pass
        return path


# Helpers -------------------------------------------------------------------------------------------

_ATOMS = (str, bytes, int, float, complex, bool, type(None), np.ndarray, np.generic)


def _walk(
    obj: Any,
    path: str,
    variables: dict[str, DistributedVariable],
    optimizers: dict[str, Optimizer],
    seen: set[int],
    depth: int,
) -> None:
    if depth > 32 or isinstance(obj, _ATOMS) or callable(obj) and not hasattr(obj, "__dict__"):
        return
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, DistributedVariable):
        variables[path] = obj
        return
    if isinstance(obj, Optimizer):
        optimizers[path] = obj
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            _walk(value, f"{path}/{key}", variables, optimizers, seen, depth + 1)
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _walk(value, f"{path}/{i}", variables, optimizers, seen, depth + 1)
        return
    if isinstance(obj, type) or type(obj).__module__ in ("builtins", "torch", "numpy"):
        return
    attrs = getattr(obj, "__dict__", None)
    if attrs:
        for key, value in attrs.items():
            if not key.startswith("_"):
                _walk(value, f"{path}/{key}", variables, optimizers, seen, depth + 1)


def _optimizer_state(
    path: str, opt: Optimizer, var_paths: dict[int, str]
) -> Iterator[tuple[str, np.ndarray]]:
    """(key, value) of the optimizer's state, one value at a time."""
    yield f"{path}/iterations", opt.iterations._checkpoint_value()
    for var, slot_name, slot in opt._slot_order:
        var_path = var_paths.get(id(var), var.name)
        yield f"{path}/slots/{var_path}/{slot_name}", slot._checkpoint_value()


def _restore_optimizer(
    path: str,
    opt: Optimizer,
    stored: dict[str, np.ndarray],
    variables: dict[str, DistributedVariable],
    restored: list[str],
    missing: list[str],
) -> None:
    if opt._strategy is None and opt._scope_strategy is None and variables:
        opt._bind(next(iter(variables.values())).distribute_strategy)
    key = f"{path}/iterations"
    if key in stored:
        opt.iterations._restore(stored[key])
        restored.append(key)
    else:
        missing.append(key)
    prefix = f"{path}/slots/"
    wanted: dict[str, list[str]] = {}
    for k in stored:
        if k.startswith(prefix):
            var_path, _, slot_name = k[len(prefix) :].rpartition("/")
            wanted.setdefault(var_path, []).append(slot_name)
    for var_path, slot_names in wanted.items():
        var = variables.get(var_path)
        if var is None:
            continue  # reported as unused
        if opt._strategy is None:
            opt._bind(var.distribute_strategy)
        opt._create_slots([var])
        for slot_name in slot_names:
            k = f"{prefix}{var_path}/{slot_name}"
            slot = opt._slots[id(var)].get(slot_name)
            if slot is not None:
                slot._restore(stored[k])
                restored.append(k)


def _should_write(
    variables: dict[str, DistributedVariable], optimizers: dict[str, Optimizer]
) -> bool:
    for var in variables.values():
        return bool(var.distribute_strategy.extended.should_checkpoint)
    for opt in optimizers.values():
        if opt._strategy is not None:
            return bool(opt._strategy.extended.should_checkpoint)
    return True


def _atomic_savez(path: str, arrays: dict[str, np.ndarray]) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename durable
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _check_key(name: str) -> None:
    if not _KEY_RE.match(name):
        raise ValueError(f"checkpoint name {name!r}: use letters, digits, '_', '-' and '.'")


def _require_cross_replica(what: str) -> None:
    frame = _context.current_frame()
    if (
        frame is not None
        and frame.replica_context is not None
        and frame.replica_context._collective_slots is not None
    ):
        raise RuntimeError(f"Checkpoint.{what}() must be called outside strategy.run()")
