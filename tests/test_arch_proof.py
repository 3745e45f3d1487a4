"""The proof on tensors that carry information (issue 33 item 1): a model whose output does not depend on its
input (a zero-initialised head) is proved on the last non-constant tensors, or refused; never 0/0 = pass."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from reference import StdConv, randomize_bn
from torch import nn

from disco.errors import RefusedError
from disco.graph import partition
from disco.masks import DiscoModel
from disco.runtime.export import compare_reference, export
from disco.runtime.proof import run_error, spread


class ZeroHead(nn.Module):
    """Two convolutions and a classifier head initialised to zero (as torchvision's ViT)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)
        nn.init.zeros_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c2(torch.relu(self.bn(self.c1(x))))
        return self.fc(y.mean((2, 3)))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return randomize_bn(ZeroHead())


def test_the_old_proof_passes_a_wrong_split_of_a_zero_head_model() -> None:
    """Why the new proof exists: against an all-zero reference, any output has error 0."""
    ref = {"output": torch.zeros(1, 5)}
    assert compare_reference(torch.zeros(1, 5), ref) == 0.0
    assert run_error(torch.zeros(1, 5), ref, {}) is None  # `disco run` reports no error, not 0


def test_a_wrong_split_of_a_zero_head_model_is_refused(tmp_path: Path) -> None:
    model = _model()
    part = partition(model, (1, 3, 8, 8), 2)
    kept = np.random.default_rng(0).random(part.n_links) < 0.5
    model.c2.__class__ = StdConv  # the model's own forward now differs from the split
    with pytest.raises(RefusedError, match=r"forward at the (output of c2|input of fc) .*output is constant"):
        export(DiscoModel(model, part, kept), part, kept, tmp_path, {"name": "zero_head"})
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_right_split_of_a_zero_head_model_is_proved_on_the_heads_input(tmp_path: Path, nodes: int) -> None:
    model = _model()
    part = partition(model, (1, 3, 8, 8), nodes)
    kept = np.random.default_rng(1).random(part.n_links) < 0.5
    man = export(DiscoModel(model, part, kept), part, kept, tmp_path, {"name": "zero_head"})
    proof = json.loads((tmp_path / "manifest.json").read_text())["proof"]
    assert proof == json.loads(json.dumps(man["proof"]))
    assert proof["output_constant"] and proof["max_rel_err"] < 1e-5
    assert any("input of fc" in c for c in proof["compared"])
    assert any("output of c2" in c for c in proof["compared"])
    assert all(s > 1e-2 for s in proof["spread"].values())
    assert run_error(torch.zeros(1, 5), {"output": torch.zeros(1, 5)}, man) is None


def test_an_informative_output_is_compared_as_before(tmp_path: Path) -> None:
    model = _model()
    nn.init.normal_(model.fc.weight)
    part = partition(model, (1, 3, 8, 8), 2)
    man = export(model, part, None, tmp_path, {"name": "zero_head"})
    assert man["proof"]["compared"] == ["output"] and not man["proof"]["output_constant"]
    assert man["proof"]["spread"]["output"] > 1e-2


def test_nothing_informative_to_compare_is_refused(tmp_path: Path) -> None:
    model = _model()
    for m in (model.c1, model.c2):
        nn.init.zeros_(m.weight)  # every mixing layer's output is its bias: nothing depends on the input
    nn.init.zeros_(model.c1.bias)
    part = partition(model, (1, 3, 8, 8), 2)
    with pytest.raises(RefusedError, match="nothing non-constant"):
        export(model, part, None, tmp_path, {"name": "zero_head"})


def test_spread() -> None:
    a = torch.randn(4, 5)
    assert spread(a, a) == 0.0 and spread(torch.zeros(3), torch.zeros(3)) == 0.0
    assert spread(a, a + 1) > 0.1
