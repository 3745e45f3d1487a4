"""One seed for every source of randomness of a run (Python, NumPy, torch; loaders get it explicitly)."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and every CUDA device).

    Data loaders own their generators: pass the same ``seed`` to ``Task.loaders``.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
