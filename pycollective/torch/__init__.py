"""pycollective as a torch.distributed backend: ``import pycollective.torch`` registers
"pycollective", and existing training code changes one string::

    import pycollective.torch  # noqa: F401  (registers the backend)
    torch.distributed.init_process_group("pycollective")   # was "gloo"
    model = torch.nn.parallel.DistributedDataParallel(model)

Every collective of the group runs on pycollective's native core (shared memory within a host,
TCP across hosts); see docs/torch.md for what is supported and how the group is formed.
This package needs torch; ``import pycollective`` alone never imports it.
"""

from __future__ import annotations

import torch.distributed as dist

from pycollective.torch.process_group import ProcessGroup, create_backend
from pycollective.torch.work import Work

BACKEND = "pycollective"


def _register() -> None:
    if BACKEND.upper() in dist.Backend._plugins:  # imported twice (e.g. by a reload)
        return
    # CUDA tensors are accepted too: they run over NCCL in a CUDA build of pycollective and fail
    # with a message saying so in a CPU build (clearer than torch's "no backend for cuda").
    dist.Backend.register_backend(
        BACKEND, create_backend, extended_api=True, devices=["cpu", "cuda"]
    )


_register()

__all__ = ["BACKEND", "ProcessGroup", "Work", "create_backend"]
