"""JAX, imported lazily: ``import pycollective`` and the other strategies never need it."""

from __future__ import annotations

from typing import Any

INSTALL_HINT = ('TPUStrategy needs JAX: pip install "pycollective[tpu]" (CPU JAX; on a TPU host '
                'install "jax[tpu]", on NVIDIA GPUs "jax[cuda12]" or "jax[cuda13]" instead)')


def require() -> Any:
    """The ``jax`` module, or an ImportError that names the extra to install."""
    try:
        import jax
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT}; importing jax failed: {exc}") from exc
    return jax


def backend_initialized() -> bool:
    """Whether JAX has already created its device backends (after which neither the number of
    CPU devices nor jax.distributed can change)."""
    import sys

    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - layout changed; assume the worst
        return True
    return bool(getattr(xla_bridge, "_backends", None))
