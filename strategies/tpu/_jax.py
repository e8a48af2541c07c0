"""JAX, imported lazily: ``import pycollective`` and the other strategies never need it."""

from __future__ import annotations

from typing import Any

INSTALL_HINT = (
    'TPUStrategy needs JAX: pip install "pycollective[tpu]" (CPU JAX; on a TPU host '
    'install "jax[tpu]", on NVIDIA GPUs "jax[cuda12]" or "jax[cuda13]" instead)'
)


#: what TPUStrategy uses from JAX (tested with jax 0.10.2; pip gives Python >= 3.11 a JAX this
#: new, while an older interpreter may get one without them)
_NEEDED = ("shard_map", "typeof", "lax.pcast")


def require() -> Any:
    """The ``jax`` module, or an ImportError that names the extra to install (or says that the
    installed JAX is too old)."""
    try:
        import jax
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT}; importing jax failed: {exc}") from exc
    missing = [name for name in _NEEDED if not _has(jax, name)]
    if missing:
        raise ImportError(
            f"TPUStrategy needs a newer JAX than {jax.__version__}: it lacks "
            f"{', '.join('jax.' + m for m in missing)} (shard_map with varying-axes types). "
            'Tested with jax 0.10.2: pip install -U "jax<0.11" (Python >= 3.11)'
        )
    return jax


def _has(module: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return False
    return True


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
