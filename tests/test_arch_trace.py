"""Failing to trace names the file and line of the data-dependent branch (issue 33 item 4)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from disco.errors import RefusedError
from disco.graph import partition


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c(x)
        if y.sum() > 0:  # data-dependent branch
            y = y * 2
        return y


def test_a_data_dependent_branch_is_named_by_file_and_line() -> None:
    with pytest.raises(RefusedError) as e:
        partition(Branchy(), (1, 3, 4, 4), 2)
    msg = str(e.value)
    line = Branchy.forward.__code__.co_firstlineno + 2
    assert f"test_arch_trace.py:{line} in forward: if y.sum() > 0:" in msg
    assert "cannot capture Branchy" in msg and len(msg.splitlines()) == 1
