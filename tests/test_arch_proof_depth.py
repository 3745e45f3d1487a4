"""A proof that reaches the end (issue 43 item 4): where a random-init network's output is constant because its
BatchNorm statistics do not fit its activations, the statistics are recalibrated on random inputs for the proof
only and the split is proved on the output; otherwise on the deepest tensors that vary. The manifest says which
tensors were compared, how deep, and whether the statistics were recalibrated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from disco.errors import RefusedError
from disco.graph import partition
from disco.masks import DiscoModel
from disco.runtime.export import export
from disco.runtime.proof import recalibrated_bn


class Collapsing(nn.Module):
    """Conv-BN-ReLU blocks whose BatchNorm means are far above the activations: every ReLU outputs zeros, so
    the output is the head's bias whatever the input (as a random-init RepVGG or ConvMixer, whose outputs are
    constant a few blocks in)."""

    def __init__(self, depth: int = 4, c: int = 8, collapse: bool = True) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
                                      for _ in range(depth)])
        self.fc = nn.Linear(c, 5)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.BatchNorm2d) and collapse:
                    m.running_mean.fill_(1e4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_constant_output_is_proved_on_the_output_with_recalibrated_statistics(tmp_path: Path, nodes: int) -> None:
    torch.manual_seed(0)
    model = Collapsing().eval()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    before = [(m.running_mean.clone(), m.running_var.clone(), m.momentum) for m in bns]
    part = partition(model, (1, 3, 8, 8), nodes)
    kept = np.random.default_rng(0).random(part.n_links) < 0.5
    man = export(DiscoModel(model, part, kept), part, kept, tmp_path, {"name": "collapsing"})
    proof = man["proof"]
    assert proof["output_constant"] and proof["recalibrated_bn"]
    assert proof["compared"] == ["output (node output)"] and proof["max_rel_err"] < 1e-5
    assert proof["depth"] == {"layer": len(part.layers), "of": len(part.layers), "tensor": "output"}
    after = [(m.running_mean, m.running_var, m.momentum) for m in bns]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2] for a, b in zip(before, after,
                                                                                                  strict=True))


def test_recalibration_changes_nothing_after_it() -> None:
    torch.manual_seed(0)
    model = Collapsing().eval()
    x = torch.randn(1, 3, 8, 8)
    y0 = model(x)
    with recalibrated_bn(model, x) as has_bn:
        assert has_bn and model(x).std() > 0 and not model.training
    assert torch.equal(model(x), y0) and not model.training


class ZeroTail(nn.Module):
    """No BatchNorm; the last two mixing layers have zero weights (nothing after the first one varies)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)
        for m in (self.c3, self.fc):
            nn.init.zeros_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.c3(torch.relu(self.c2(torch.relu(self.c1(x))))).mean((2, 3)))


def test_without_batchnorm_the_deepest_varying_tensor_is_compared_and_its_depth_said(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ZeroTail().eval()
    part = partition(model, (1, 3, 8, 8), 2)
    man = export(model, part, None, tmp_path, {"name": "zero_tail"})
    proof = man["proof"]
    assert proof["output_constant"] and not proof["recalibrated_bn"]
    assert proof["depth"]["of"] == 4 and proof["depth"]["layer"] == 3  # the input of c3 (c2's output)
    assert any("c3" in c for c in proof["compared"])


def test_nothing_that_varies_is_still_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ZeroTail().eval()
    for m in (model.c1, model.c2):
        nn.init.zeros_(m.weight)
    part = partition(model, (1, 3, 8, 8), 2)
    with pytest.raises(RefusedError, match="even with its BatchNorm statistics recalibrated"):
        export(model, part, None, tmp_path, {"name": "zero_all"})
