import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def cifar_dir() -> Path:
    d = SHARED / "cifar10"
    if not (d / "test.tar").is_file():
        pytest.skip(f"shared CIFAR-10 not found at {d} (needs ../shared/data/cifar10)")
    return d
