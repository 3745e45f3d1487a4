"""Constants made in forward and branches on the input's shape (issue 43 item 3): a tensor made from sizes
(``torch.zeros``, ``arange``, a position grid, ``x.new_zeros`` written into) is made once at capture and held
whole by every node; a size becomes a literal (a node holding half the channels never recomputes ``C // heads``
from its slice); a branch on the input's shape is resolved for the export's shape and recorded (every engine already
refuses an input of another shape than the export's). Invariants 1-4 at N=2 and N=3."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from reference import check_invariants, rel_err
from torch import nn

from disco.graph import partition
from disco.masks import DiscoModel


class PositionGrid(nn.Module):
    """A Fourier position encoding of the feature map's size, projected by a 1x1 convolution (EdgeNeXt), and a
    zero class token made in forward and concatenated along the tokens (CoaT)."""

    def __init__(self, c: int = 12, hidden: int = 4) -> None:
        super().__init__()
        self.hidden = hidden
        self.stem = nn.Conv2d(3, c, 2, stride=2)
        self.pos = nn.Conv2d(2 * hidden, c, 1)
        self.fc = nn.Linear(c, c)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        b, c, h, w = x.shape
        ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32),
                                indexing="ij")
        freq = torch.arange(self.hidden, dtype=torch.float32) + 1
        grid = torch.cat([(ys[None] * freq[:, None, None]).sin(), (xs[None] * freq[:, None, None]).cos()])
        x = x + self.pos(grid[None])
        t = x.flatten(2).transpose(1, 2)  # B, N, C
        zero = torch.zeros((b, 1, c), dtype=t.dtype, device=t.device)  # sizes from a split tensor: C is global
        t = torch.cat([zero, t], dim=1) * (c // 3) ** -0.5
        return self.head(self.fc(t).mean(1))


class ShiftMask(nn.Module):
    """A mask made with ``new_zeros`` of the tensor's size and written into by slices (Swin's shifted windows),
    multiplied in."""

    def __init__(self, c: int = 12, half: int = 8) -> None:
        super().__init__()
        self.half = half
        self.stem = nn.Conv2d(3, c, 2, stride=2)
        self.fc = nn.Linear(c, c)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.stem(x).flatten(2).transpose(1, 2)  # B, N, C
        n = t.shape[1]
        mask = t.new_zeros((n, n))
        mask[: n // 2, n // 2:] = -1.0  # slices by a size of the input: resolved for the captured shape
        mask[n // 2:, : n // 2] = -1.0
        y = self.fc(t).transpose(1, 2)  # B, C, N
        return self.head((y @ mask.softmax(-1)).mean(2))


class PadToMultiple(nn.Module):
    """A branch on the input's shape (MobileViT's unfold): pad to a multiple of the patch size when needed."""

    def __init__(self, c: int = 8, patch: int = 4) -> None:
        super().__init__()
        self.patch = patch
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.fc = nn.Conv2d(c, c, 1)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        b, c, h, w = x.shape
        new_h = math.ceil(h / self.patch) * self.patch
        if new_h != h:
            x = F.interpolate(x, size=(new_h, new_h), mode="bilinear", align_corners=False)
        x = x.reshape(b * c * (new_h // self.patch), self.patch, new_h // self.patch, self.patch).transpose(1, 2)
        x = x.reshape(b, c, -1, self.patch * self.patch)  # the channel merged with the batch dim and back
        return self.head(self.fc(x).mean((2, 3)))


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize(("cls", "shape"), [(PositionGrid, (1, 3, 8, 8)), (ShiftMask, (1, 3, 8, 8)),
                                            (PadToMultiple, (1, 3, 6, 6)), (PadToMultiple, (1, 3, 8, 8))])
def test_invariants(cls: type, shape: tuple[int, ...], nodes: int) -> None:
    torch.manual_seed(0)
    model = cls().eval()
    x = torch.randn(shape)
    part = partition(model, x, nodes)
    with torch.no_grad():
        assert rel_err(DiscoModel(model, part).eval()(x), model(x)) < 1e-5  # invariant 1
    check_invariants(cls().eval(), x, nodes)


def test_constants_are_held_whole_by_every_node() -> None:
    part = partition(PositionGrid().eval(), (1, 3, 8, 8), 2)
    consts = [n for n in part.gm.graph.nodes if n.op == "get_attr" and n.name not in part.param_nodes
              and "stem" not in str(n.target) and "pos" not in str(n.target)]
    assert consts and all((part.owner[n.name] == -1).all() for n in consts)
    assert not any(n.target in (torch.zeros, torch.arange, torch.meshgrid) for n in part.gm.graph.nodes)


def test_a_shape_branch_is_resolved_for_the_captured_shape_and_recorded() -> None:
    taken = partition(PadToMultiple().eval(), (1, 3, 6, 6), 2)
    skipped = partition(PadToMultiple().eval(), (1, 3, 8, 8), 2)
    assert len(taken.shape_guards) == 1 and taken.shape_guards[0].endswith("if new_h != h: -> True")
    assert "test_arch_constants.py:" in taken.shape_guards[0]
    assert skipped.shape_guards[0].endswith("-> False")
    assert any(n.target is F.interpolate for n in taken.gm.graph.nodes)
    assert not any(n.target is F.interpolate for n in skipped.gm.graph.nodes)


@pytest.mark.parametrize("fmt", ["torch", "onnx"])
def test_the_shape_guards_are_written_into_the_manifest(tmp_path, fmt: str) -> None:
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    from disco.runtime.formats import exporter

    model = PadToMultiple().eval()
    part = partition(model, (1, 3, 6, 6), 2)
    man = exporter(fmt)(DiscoModel(model, part).eval(), part, None, tmp_path / fmt, {"name": "x", "kwargs": {}})
    assert man["shape_guards"] == list(part.shape_guards) and man["shape_guards"][0].endswith("-> True")
