"""Train digits with MultiWorkerMirroredStrategy through worker losses, without a restart.

    pycollective run -n 2:3 python examples/train_digits_elastic.py --backup-dir /tmp/bk
    pycollective run -n 3 --max-restarts 1 python examples/train_digits_elastic.py ...

``strategies.BackupAndRestore`` backs the loop up every ``--save-freq`` steps. When a worker dies
(try ``kill -9`` on one), the others' collective fails, they re-form the group with whoever is
alive (and the replacement the launcher starts with ``--max-restarts``), restore the newest
backup and go on from its step. Step s trains on a global batch drawn from (seed, s) alone, split
over the workers of the moment, so a resumed run repeats the lost steps exactly.

``--handler preemption`` drives the loop with ``PreemptionCheckpointHandler`` instead (tf's
preemption API): a SIGTERM to any worker makes every worker save at the same step and exit 42;
the next launch resumes from that checkpoint.

``--kill-at S --kill-rank R`` makes worker R SIGKILL itself at step S, once (for tests);
``--term-at S --term-rank R`` sends it SIGTERM instead (a preemption notice).
``--resume-from FILE`` trains from that checkpoint's step instead (a reference run).
``--out FILE``: the chief writes the final parameters and the recoveries there (.npz, .json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_digits import SoftmaxRegression, load_data  # noqa: E402

import pycollective as pc  # noqa: E402
from pycollective.strategies import (  # noqa: E402
    SGD,
    BackupAndRestore,
    Checkpoint,
    MultiWorkerMirroredStrategy,
    ReduceOp,
    experimental,
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=96, help="global batch size")
    parser.add_argument("--save-freq", type=int, default=10)
    parser.add_argument("--min-workers", type=int, default=1)
    parser.add_argument("--keep", type=int, default=2, help="backups kept on disk")
    parser.add_argument("--backup-dir", default=None)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--kill-rank", type=int, default=0)
    parser.add_argument("--term-at", type=int, default=None)
    parser.add_argument("--term-rank", type=int, default=0)
    parser.add_argument("--handler", choices=["backup", "preemption"], default="backup")
    parser.add_argument("--out", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    strategy = MultiWorkerMirroredStrategy()
    (x_train, y_train), _ = load_data(args.seed)
    with strategy.scope():
        model = SoftmaxRegression(x_train.shape[1], 10)
        optimizer = SGD(0.2, momentum=0.9, gradient_aggregation=ReduceOp.SUM)
    checkpoint = Checkpoint(model=model.variables, optimizer=optimizer)

    def train_step(batch, global_batch_size):
        x, y = batch
        _, grads = model.loss_and_gradients(x, y, scale=global_batch_size)
        optimizer.apply_gradients(zip(grads, model.variables))

    def step_fn(step: int) -> None:
        if step == args.kill_at and pc.rank() == args.kill_rank and _first_time(args):
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.term_at and pc.rank() == args.term_rank and _first_time(args):
            os.kill(os.getpid(), signal.SIGTERM)
        rng = np.random.default_rng((args.seed, step))
        chosen = rng.choice(len(x_train), args.batch_size, replace=False)
        mine = np.array_split(chosen, pc.world_size())[pc.rank()]
        strategy.run(train_step, args=((x_train[mine], y_train[mine]), args.batch_size))

    if args.resume_from is not None:
        checkpoint.restore(args.resume_from)
        start = int(re.search(r"-(\d+)\.npz$", args.resume_from).group(1))
        for step in range(start, args.steps):
            step_fn(step)
        history: list = []
    elif args.handler == "preemption":
        handler = experimental.PreemptionCheckpointHandler(
            strategy.cluster_resolver, checkpoint, args.backup_dir, min_workers=args.min_workers
        )
        while handler.total_run_calls < args.steps:
            handler.run(step_fn, handler.total_run_calls)
        history = [r.__dict__ for r in handler.history]
    else:
        backup = BackupAndRestore(
            checkpoint,
            args.backup_dir,
            save_freq=args.save_freq,
            delete_checkpoint=False,
            min_workers=args.min_workers,
            keep=args.keep,
        )
        backup.run(step_fn, args.steps)
        history = [r.__dict__ for r in backup.history]
    if args.out and strategy.extended.should_checkpoint:
        params = {f"p{i}": np.asarray(v) for i, v in enumerate(model.variables)}
        np.savez(args.out + ".npz", **params)
        with open(args.out + ".json", "w") as f:
            json.dump({"world_size": pc.world_size(), "recoveries": history}, f)
    pc.shutdown()


def _first_time(args) -> bool:
    """True once per job: the marker file says a worker was already killed."""
    marker = os.path.join(args.backup_dir or ".", "killed")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


if __name__ == "__main__":
    main()
