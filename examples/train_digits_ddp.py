"""The digits MLP with torch DistributedDataParallel over the "pycollective" backend.

    torchrun --nproc_per_node 2 examples/train_digits_ddp.py          # or:
    pycollective run -n 2 python examples/train_digits_ddp.py
    ... --backend gloo                                                 # the same with gloo

The only pycollective-specific lines are the import that registers the backend and the
backend's name: everything else is plain torch.distributed + DDP. Each rank trains on its own
shard of every batch; DDP all-reduces the gradients through pycollective's native core.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from train_digits import batches, load_data

import pycollective.torch  # noqa: F401  registers the "pycollective" backend


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="pycollective")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the ranks are the parallelism

    dist.init_process_group(args.backend)  # env:// from torchrun or pycollective run
    rank, size = dist.get_rank(), dist.get_world_size()
    (x_train, y_train), (x_test, y_test) = load_data()
    torch.manual_seed(0)  # DDP broadcasts rank 0's parameters anyway
    model = DDP(
        torch.nn.Sequential(
            torch.nn.Linear(x_train.shape[1], args.hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(args.hidden, 10),
        )
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)  # the same batch order on every rank
    for _epoch in range(args.epochs):
        for xb, yb in batches(x_train, y_train, args.batch_size, rng):
            mine = slice(rank, None, size)  # this rank's share of the global batch
            loss = F.cross_entropy(
                model(torch.from_numpy(xb[mine]).float()), torch.from_numpy(yb[mine]).long()
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        correct = (
            model(torch.from_numpy(x_test).float()).argmax(1) == torch.from_numpy(y_test)
        ).sum()
    dist.all_reduce(correct)  # every rank evaluated the whole test set: average the counts
    accuracy = correct.item() / size / len(y_test)
    if rank == 0:
        print(f"{args.backend}: {size} ranks, test accuracy {accuracy:.3f}")
    dist.destroy_process_group()
    return accuracy


if __name__ == "__main__":
    main()
