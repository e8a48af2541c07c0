"""The base of every variable-like value: distributed variables and their per-replica components.

It sits below ``values`` so that ``values`` and ``cross_device_ops`` can tell a variable from
other values without importing ``variables`` (which builds on them): ``run()`` passes variables
whole instead of splitting them per replica, and reductions read them as arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class VariableOps:
    """Arithmetic on a variable reads it (this replica's copy inside run). Subclasses provide
    ``read_value()``, the value as an array."""

    def _read(self) -> np.ndarray:
        raise NotImplementedError

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self._live()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def _live(self) -> np.ndarray:
        raise NotImplementedError

    def __add__(self, o: Any) -> Any:
        return self._read() + _operand(o)

    def __radd__(self, o: Any) -> Any:
        return _operand(o) + self._read()

    def __sub__(self, o: Any) -> Any:
        return self._read() - _operand(o)

    def __rsub__(self, o: Any) -> Any:
        return _operand(o) - self._read()

    def __mul__(self, o: Any) -> Any:
        return self._read() * _operand(o)

    def __rmul__(self, o: Any) -> Any:
        return _operand(o) * self._read()

    def __truediv__(self, o: Any) -> Any:
        return self._read() / _operand(o)

    def __rtruediv__(self, o: Any) -> Any:
        return _operand(o) / self._read()

    def __matmul__(self, o: Any) -> Any:
        return self._read() @ _operand(o)

    def __rmatmul__(self, o: Any) -> Any:
        return _operand(o) @ self._read()

    def __pow__(self, o: Any) -> Any:
        return self._read() ** _operand(o)

    def __neg__(self) -> Any:
        return -self._read()

    def __getitem__(self, key: Any) -> Any:
        return self._read()[key]

    def __len__(self) -> int:
        return len(self._read())

    def __float__(self) -> float:
        return float(self._read())

    def __int__(self) -> int:
        return int(self._read())


def _operand(o: Any) -> Any:
    return o._read() if isinstance(o, VariableOps) else o
