"""The dataset pass of a run (``--data``): the leader feeds the task's test split through the split model,
the other ranks follow, and the task's metric is computed on the distributed outputs."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from .options import RunOptions
from .rendezvous import DeadlineStore, wait_keys

PROGRESS_ENV = "DISCO_PROGRESS"  # the launcher's progress file: the leader writes "done total" into it


class _Progress:
    """Writes "done total" to the launcher's progress file at most every 0.2 s (nothing without one)."""

    def __init__(self, path: str | None, total: int) -> None:
        self.path, self.total, self.done, self.last = path, total, 0, 0.0
        self._write()

    def step(self) -> None:
        self.done += 1
        if self.done == self.total or time.monotonic() - self.last > 0.2:
            self._write()

    def _write(self) -> None:
        if self.path:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"{self.done} {self.total}")
            os.replace(tmp, self.path)
            self.last = time.monotonic()


def run_data(opts: RunOptions, man: dict[str, Any], ex: Any, store: DeadlineStore, rank: int) -> dict[str, Any] | None:
    """Run the task's test split through the split model (the leader feeds it; the others follow)."""
    if rank != 0:
        wait_keys(store, ["data/n"], opts.timeout, "waiting for the data count")
        for _ in range(int(store.get("data/n"))):
            ex.run(None)
        return None
    from ..tasks import get_task

    task = get_task(man.get("task") or "cifar10")
    _, test = task.loaders(opts.data, int(man["input_shape"][0]), limit=opts.limit)
    b = int(man["input_shape"][0])  # the split model runs at its exported batch size
    batches = [(xb[i:i + b], yb[i:i + b]) for xb, yb in test for i in range(0, len(yb) - b + 1, b)]
    store.set("data/n", str(len(batches)))
    outs, targets = [], []
    progress = _Progress(os.environ.get(PROGRESS_ENV), len(batches))
    for xb, yb in batches:
        outs.append(ex.run([xb.contiguous()]))
        targets.append(yb)
        progress.step()

    class _Replay(torch.nn.Module):  # feeds the recorded distributed outputs to the task's metric
        def __init__(self) -> None:
            super().__init__()
            self.k = 0

        def forward(self, _x: torch.Tensor) -> torch.Tensor:
            self.k += 1
            return outs[self.k - 1]

    metrics = task.evaluate(_Replay(), list(zip([b[0] for b in batches], targets, strict=True)))
    return {"task": task.name, **metrics, "n": len(batches) * b}

