"""One measured configuration: the unit every suite produces and every report consumes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .metrics import algbw, busbw


@dataclass
class Row:
    collective: str
    nbytes: int  # one rank's buffer (allgather: its input block x n ranks)
    count: int
    dtype: str
    algo: str  # algorithm, or the peer's name (numpy, gloo, mpi, ...)
    transport: str  # inproc, shm, tcp, grpc, or the peer's transport
    world: int
    median_s: float
    p10_s: float
    p90_s: float
    wrong: int = 0
    peer: bool = False  # a library we compare against, not pycollective
    extra: dict = field(default_factory=dict)

    @property
    def algbw(self) -> float:
        return algbw(self.nbytes, self.median_s)

    @property
    def busbw(self) -> float:
        return busbw(self.collective, self.world, self.nbytes, self.median_s)

    @property
    def label(self) -> str:
        return f"{self.algo}/{self.transport}"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["algbw_Bps"] = self.algbw
        d["busbw_Bps"] = self.busbw
        return d
