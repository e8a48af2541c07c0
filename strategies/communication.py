"""Options for cross-replica communication (tf.distribute.experimental.CommunicationOptions)."""

from __future__ import annotations

import enum
from typing import Any


class CommunicationImplementation(enum.Enum):
    """Cross device communication implementation.

    ``AUTO``: pycollective picks the algorithm by size (``algo="auto"``). ``RING``: the ring
    all-reduce/all-gather. ``NCCL``: NVIDIA's NCCL; CPU replicas have no NCCL, so it falls back
    to the ring (logged once).
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


#: The older name, kept as tf.distribute.experimental.CollectiveCommunication.
CollectiveCommunication = CommunicationImplementation


class CommunicationOptions:
    """Options for cross device communications like all-reduce.

    Args:
        bytes_per_pack: a non-negative integer. All-reduces of many tensors are fused into
            packs of at most this many bytes, one collective per pack; 0 means no splitting
            by size (the cross-device ops' ``num_packs`` decides, by default one pack).
        timeout_seconds: a float or None: seconds a collective (and the wait for the other
            replicas) may take before it fails; None uses ``PYCOLLECTIVE_TIMEOUT``.
        implementation: a CommunicationImplementation (or its name).
        compress: None, ``"bf16"`` or ``"fp16"`` (a pycollective extension): float32 gradients
            cross network links between workers as 16-bit values and are summed in float32
            (``pycollective.allreduce(..., compress=)``): half the bytes on slow links.
        error_feedback: with ``compress``, each worker adds the rounding residue of its last
            step's gradients to the next step's (error feedback, as in 1-bit SGD and EF-SGD),
            so the rounding does not accumulate into a bias over training.
    """

    def __init__(
        self,
        bytes_per_pack: int = 0,
        timeout_seconds: float | None = None,
        implementation: CommunicationImplementation | str = CommunicationImplementation.AUTO,
        compress: str | None = None,
        error_feedback: bool = False,
    ) -> None:
        if (
            isinstance(bytes_per_pack, bool)
            or not isinstance(bytes_per_pack, int)
            or bytes_per_pack < 0
        ):
            raise ValueError(
                f"bytes_per_pack must be a non-negative integer, got {bytes_per_pack!r}"
            )
        if timeout_seconds is not None:
            if (
                isinstance(timeout_seconds, bool)
                or not isinstance(timeout_seconds, (int, float))
                or timeout_seconds <= 0
            ):
                raise ValueError(
                    f"timeout_seconds must be a positive number or None, got {timeout_seconds!r}"
                )
            timeout_seconds = float(timeout_seconds)
        if compress not in (None, "bf16", "fp16"):
            raise ValueError(f"compress must be None, 'bf16' or 'fp16', got {compress!r}")
        if not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback must be True or False, got {error_feedback!r}")
        if error_feedback and compress is None:
            raise ValueError(
                "error_feedback=True corrects the rounding of compressed gradients: "
                "set compress='bf16' or 'fp16' too"
            )
        self.bytes_per_pack = bytes_per_pack
        self.timeout_seconds = timeout_seconds
        self.implementation = _parse_implementation(implementation)
        self.compress = compress
        self.error_feedback = error_feedback

    def merge(self, options: CommunicationOptions | None) -> CommunicationOptions:
        """These options with the non-default fields of ``options`` taking precedence."""
        if options is None:
            return self
        if not isinstance(options, CommunicationOptions):
            raise TypeError(f"options must be a CommunicationOptions, got {type(options).__name__}")
        return CommunicationOptions(
            bytes_per_pack=options.bytes_per_pack or self.bytes_per_pack,
            timeout_seconds=(
                options.timeout_seconds
                if options.timeout_seconds is not None
                else self.timeout_seconds
            ),
            implementation=(
                options.implementation
                if options.implementation != CommunicationImplementation.AUTO
                else self.implementation
            ),
            compress=options.compress or self.compress,
            error_feedback=options.error_feedback or self.error_feedback,
        )

    def __repr__(self) -> str:
        return (
            f"CommunicationOptions(bytes_per_pack={self.bytes_per_pack}, "
            f"timeout_seconds={self.timeout_seconds}, "
            f"implementation={self.implementation}, compress={self.compress!r}, "
            f"error_feedback={self.error_feedback})"
        )

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.bytes_per_pack,
            self.timeout_seconds,
            self.implementation,
            self.compress,
            self.error_feedback,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CommunicationOptions) and ((self._fields()) == (other._fields()))


def _parse_implementation(value: Any) -> CommunicationImplementation:
    if isinstance(value, CommunicationImplementation):
        return value
    if isinstance(value, str) and value.upper() in CommunicationImplementation.__members__:
        return CommunicationImplementation[value.upper()]
    raise ValueError(
        f"implementation must be CommunicationImplementation.AUTO, RING or NCCL, got {value!r}"
    )
