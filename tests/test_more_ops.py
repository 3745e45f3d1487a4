"""Rules for common architectures' ops: same padding computed in the forward, spatial padding, inference-time
identities, channels-first LayerNorm, channel permutations (shuffle, chunk, slices). Invariants 1-4 of DESIGN.md
on a tiny model using each, and refusal by name of what no rule describes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference import check_invariants, randomize_bn, rel_err
from torch import nn

from disco.graph import UnsupportedOpError, partition
from disco.masks import DiscoModel

timm_layers = pytest.importorskip("timm.layers")
tv_ops = pytest.importorskip("torchvision.ops")
from torchvision.models.convnext import LayerNorm2d  # noqa: E402


class SamePad(nn.Module):
    """timm's dynamic same-padding conv and pooling, F.pad / ZeroPad2d / ReflectionPad2d, BatchNormAct2d,
    stochastic depth (torchvision) and drop path (timm)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = timm_layers.Conv2dSame(3, 8, 3, stride=2)  # padding from the input size, asymmetric at 2
        self.bn = timm_layers.BatchNormAct2d(8, act_layer=nn.SiLU)
        self.dw = timm_layers.Conv2dSame(8, 8, 5, stride=2, groups=8)
        self.pool = timm_layers.create_pool2d("max", 3, stride=2, padding="same")  # MaxPool2dSame
        self.zpad = nn.ZeroPad2d((1, 0, 2, 1))
        self.rpad = nn.ReflectionPad2d(1)
        self.c2 = nn.Conv2d(8, 10, 3)
        self.c3 = nn.Conv2d(10, 10, 3, padding=1)
        self.sd = tv_ops.StochasticDepth(0.3, "row")
        self.dp = timm_layers.DropPath(0.2)
        self.fc = nn.Linear(10, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.stem(x))
        y = self.pool(self.dw(y))
        y = self.c2(self.rpad(self.zpad(y)))
        y = F.pad(y, (1, 1, 0, 2), value=0.5)
        y = y + self.sd(self.c3(y)) + self.dp(y)
        return self.fc(y.mean((2, 3)))


class ConvNeXtish(nn.Module):
    """ConvNeXt's block: depthwise conv, channels-first LayerNorm2d, permute, LayerNorm, Linear, permute back,
    a layer scale of shape C x 1 x 1."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 2, stride=2)
        self.ln2d = LayerNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.ln = nn.LayerNorm(8)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)
        self.scale = nn.Parameter(torch.rand(8, 1, 1) + 0.5)
        self.ln_t = timm_layers.LayerNorm2d(8)
        self.head = nn.Conv2d(8, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln2d(self.stem(x))
        z = self.dw(y).permute(0, 2, 3, 1)
        z = self.fc2(F.gelu(self.fc1(self.ln(z))))
        y = y + self.scale * torch.permute(z, (0, 3, 1, 2))
        return self.head(self.ln_t(y))


def _channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:  # as torchvision's ShuffleNetV2
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(b, -1, h, w)


class Shuffle(nn.Module):
    """ShuffleNetV2's unit: chunk, a branch on one half, cat, channel shuffle; split with sizes, a channel slice."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 12, 3, padding=1)
        self.branch = nn.Sequential(nn.Conv2d(6, 6, 1), nn.BatchNorm2d(6), nn.ReLU(),
                                    nn.Conv2d(6, 6, 3, padding=1, groups=6), nn.Conv2d(6, 6, 1))
        self.c2 = nn.Conv2d(12, 9, 1)
        self.c3 = nn.Conv2d(5, 7, 3, padding=1)
        self.c4 = nn.Conv2d(4 + 7, 6, 1)
        self.c5 = nn.Conv2d(6, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.stem(x))
        a, b = y.chunk(2, dim=1)
        y = _channel_shuffle(torch.cat((a, self.branch(b)), dim=1), 3)
        y = self.c2(y)
        p, q = torch.split(y, [4, 5], dim=1)
        return self.c4(torch.cat([p, self.c3(q)], 1)) + self.c5(y[:, 2:8])


MODELS = {"samepad": (SamePad, (1, 3, 19, 17)), "convnextish": (ConvNeXtish, (2, 3, 12, 12)),
          "shuffle": (Shuffle, (1, 3, 8, 8))}


def _model(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    make, shape = MODELS[name]
    model = randomize_bn(make())
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return model.eval(), torch.randn(shape)


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("name", list(MODELS))
def test_invariant1_all_links_equals_original(name: str, nodes: int) -> None:
    model, x = _model(name)
    with torch.no_grad():
        ref = model(x)
    part = partition(model, x, nodes)
    assert part.n_links > 0
    with torch.no_grad():
        assert rel_err(DiscoModel(model, part).eval()(x), ref) < 1e-5


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("name", list(MODELS))
def test_invariants_2_to_4_and_the_masks(name: str, nodes: int) -> None:
    check_invariants(*_model(name, seed=1), nodes)


def test_channel_shuffle_is_a_permutation_and_moves_no_channel() -> None:
    """Ownership follows each channel through chunk, cat and the shuffle; views add no links."""
    model, x = _model("shuffle")
    part = partition(model, x, 2)
    shuffled = next(n for n in part.gm.graph.nodes if n.name == "view_1")  # the view merging (C/g, g) back
    cat = next(n for n in part.gm.graph.nodes if n.name == "cat")
    perm = np.arange(12).reshape(3, 4).T.reshape(-1)
    assert np.array_equal(part.owner[shuffled.name], part.owner[cat.name][perm])
    assert set(part.link_tensors) <= {n.name for n in part.gm.graph.nodes if n.op in ("call_module", "call_function")
                                      and n.name in part.base_names}


class StdConv(nn.Conv2d):
    """A Conv2d subclass whose forward standardises the weights (as timm's StdConv2d)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None, training=True, eps=1e-6)
        return F.conv2d(x, w.reshape_as(self.weight), self.bias, self.stride, self.padding)


class PlainSubclass(nn.Conv2d):
    """A subclass that changes nothing the convolution computes."""

    extra = "tag"


@pytest.mark.parametrize("conv,ok", [(StdConv, False), (PlainSubclass, True), (timm_layers.StdConv2d, False)])
def test_a_subclass_that_redefines_forward_is_refused_by_name(conv: type, ok: bool) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 1), conv(4, 4, 3, padding=1), nn.ReLU()).eval()
    if ok:
        assert partition(model, (1, 3, 6, 6), 2).n_links > 0
        return
    with pytest.raises(UnsupportedOpError, match=rf"module {conv.__name__} at '1' is a subclass of Conv2d that "
                                                 "redefines its forward"):
        partition(model, (1, 3, 6, 6), 2)


class Refused(nn.Module):
    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case
        self.c = nn.Conv2d(3, 8, 1)
        self.bn = timm_layers.BatchNormAct2d(8, act_layer=nn.Softmax2d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c(x)
        if self.case == "pad_channels":
            return F.pad(y.permute(0, 2, 3, 1), (0, 1))
        if self.case == "split_view":
            return torch.relu(y.reshape(1, 2, 64))  # channel groups merged with the plane (heads: test_arch_heads)
        return self.bn(y)


@pytest.mark.parametrize("case,msg", [("pad_channels", "pads the channel dim"),
                                      ("split_view", "groups channels merged with other dims"),
                                      ("norm_act", "has a child 'act' \\(Softmax2d\\) that is not a channel-local")])
def test_uses_no_rule_describes_are_refused(case: str, msg: str) -> None:
    with pytest.raises(UnsupportedOpError, match=msg):
        partition(Refused(case).eval(), (1, 3, 4, 4), 2)
