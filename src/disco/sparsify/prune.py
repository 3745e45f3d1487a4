"""Gradual pruning of links while fine-tuning (a training-loop hook)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from ..masks import DiscoModel
from .scores import magnitude_scores, random_scores
from .select import cubic_ratio, select_links

log = logging.getLogger(__name__)

SELECTIONS = ("magnitude", "taylor", "random")


class GradualPruner:
    """Every ``every`` steps, lower r along the cubic schedule and keep the best-scoring links.

    Pruning ends after ``prune_steps`` steps exactly at ``target``; the rest of the run
    fine-tunes the final kept set. Links are never regrown.
    """

    def __init__(
        self, dm: DiscoModel, target: float, prune_steps: int, *, budget: str = "global",
        selection: str = "magnitude", every: int = 50, taylor_fn: Callable[[DiscoModel], np.ndarray] | None = None,
        seed: int = 0,
    ) -> None:
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
        if selection == "taylor" and taylor_fn is None:
            raise ValueError("taylor selection needs taylor_fn (a callable computing Taylor scores)")
        self.dm, self.target, self.prune_steps = dm, target, max(1, prune_steps)
        self.budget, self.selection, self.every = budget, selection, max(1, every)
        self.taylor_fn, self.seed = taylor_fn, seed
        self.done = False
        self._random = random_scores(dm.partition.n_links, seed) if selection == "random" else None

    def scores(self) -> np.ndarray:
        if self.selection == "random":
            return self._random
        if self.selection == "taylor":
            return self.taylor_fn(self.dm)
        return magnitude_scores(self.dm)

    def __call__(self, step: int, total_steps: int) -> None:
        if self.done or (step % self.every and step < self.prune_steps):
            return
        r = cubic_ratio(step, self.prune_steps, self.target)
        kept = select_links(self.dm.partition, self.scores(), r, self.budget, within=self.dm.kept)
        self.dm.set_kept(kept)
        if step >= self.prune_steps:
            self.done = True
            log.info("pruning done at step %d: r = %.4f (target %.4f)", step, self.dm.ratio, self.target)

    def state_dict(self) -> dict[str, Any]:
        return {"kept": self.dm.kept.copy(), "done": self.done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dm.set_kept(state["kept"])
        self.done = state["done"]
