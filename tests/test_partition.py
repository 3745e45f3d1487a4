import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference import randomize_bn, reference_forward, rel_err
from torch import nn

from disco.graph import REPLICATED, UnsupportedOpError, partition, split_owner
from disco.graph.capture import capture
from disco.masks import DiscoModel
from disco.models import build_model


class AllOps(nn.Module):
    """Every op the issue lists, in one small model."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 12, 3, padding=1)
        self.bn = nn.BatchNorm2d(12)
        self.dw = nn.Conv2d(12, 12, 3, padding=2, dilation=2, groups=12)  # depthwise, dilated
        self.g = nn.Conv2d(12, 12, 3, stride=2, padding=1, groups=3)  # grouped, strided
        self.se1 = nn.Conv2d(12, 4, 1)
        self.se2 = nn.Conv2d(4, 12, 1)
        self.up = nn.ConvTranspose2d(12, 6, 2, stride=2)
        self.ps = nn.Conv2d(6, 20, 3, padding=1)  # 20 = 5 * 2 * 2 for PixelShuffle(2)
        self.shuffle = nn.PixelShuffle(2)
        self.mix = nn.Conv2d(5 + 12, 7, 1)  # 7 channels: not divisible by 2, 3 or 4
        self.pool = nn.MaxPool2d(2)
        self.apool = nn.AvgPool2d(2)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(0.1)
        self.ident = nn.Identity()
        self.fc = nn.Linear(7 * 4 * 4 + 7, 10)
        self.acts = nn.ModuleList([nn.ReLU(), nn.ReLU6(), nn.LeakyReLU(0.2), nn.SiLU(), nn.GELU(), nn.Hardswish()])
        self.hsig = nn.Hardsigmoid()
        self.sig = nn.Sigmoid()

    def forward(self, x):
        y = self.acts[0](self.bn(self.c1(x)))
        y = self.acts[1](self.dw(y)) + y
        y = self.acts[2](self.g(y))
        gate = self.hsig(self.se2(self.acts[3](self.se1(F.adaptive_avg_pool2d(y, 1)))))
        y = y * gate
        z = self.acts[4](self.up(y))
        z = self.shuffle(self.ps(z))  # 5 channels at 2x
        z = F.interpolate(z, size=y.shape[-2:], mode="bilinear", align_corners=False)
        z = torch.cat([z, self.sig(y)], 1)
        z = self.acts[5](self.mix(z))
        a = self.ident(self.apool(self.pool(self.upsample(z))))
        flat = torch.cat([torch.flatten(a, 1), self.gap(z).flatten(1)], 1)
        return self.fc(self.drop(flat))


MODELS = {
    "allops": (lambda: AllOps(), (2, 3, 16, 16)),
    "cifar_resnet20": (lambda: build_model("cifar_resnet20"), (2, 3, 32, 32)),
    "resnet18": (lambda: build_model("resnet18"), (1, 3, 64, 64)),
    "resnet50": (lambda: build_model("resnet50"), (1, 3, 64, 64)),
    "vgg11_bn": (lambda: build_model("vgg11_bn"), (1, 3, 32, 32)),
    "mobilenet_v3_small": (lambda: build_model("mobilenet_v3_small"), (1, 3, 64, 64)),
    "rrdbnet_tiny": (lambda: build_model("rrdbnet_tiny"), (1, 3, 12, 12)),
}


@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
@pytest.mark.parametrize("name", list(MODELS))
def test_invariant1_all_links_equals_original(name, nodes):
    """DESIGN invariant 1: with every link kept the DISCO model equals the original (fp32, < 1e-5)."""
    torch.manual_seed(0)
    make, shape = MODELS[name]
    model = make().eval()
    randomize_bn(model)
    x = torch.randn(shape)
    with torch.no_grad():
        ref = model(x)
    part = partition(model, x, nodes)
    assert nodes == 1 or part.n_links > 0
    dm = DiscoModel(model, part).eval()
    with torch.no_grad():
        assert rel_err(dm(x), ref) < 1e-5


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("name", ["allops", "cifar_resnet20", "mobilenet_v3_small", "vgg11_bn", "rrdbnet_tiny"])
def test_masked_model_matches_activation_masking_reference(name, nodes):
    """Weight masks compute what nodes compute when each only sees its own + received channels."""
    torch.manual_seed(1)
    make, shape = MODELS[name]
    model = make().eval()
    randomize_bn(model)
    x = torch.randn(shape)
    plain = copy.deepcopy(model)
    part = partition(model, x, nodes)
    kept = np.random.default_rng(0).random(part.n_links) < 0.3
    dm = DiscoModel(model, part, kept).eval()
    ref_gm = capture(plain, x)
    with torch.no_grad():
        assert rel_err(dm(x), reference_forward(part, ref_gm, kept, x)) < 1e-5


def test_no_links_equals_separated_branches_by_hand():
    """r = 0 is N independent sub-networks: a chain of convs becomes grouped convs with N groups."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 6, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(6, 4, 1)).eval()
    x = torch.randn(2, 3, 8, 8)
    grouped = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 6, 3, padding=1, groups=2),
                            nn.ReLU(), nn.Conv2d(6, 4, 1, groups=2)).eval()
    grouped[0].load_state_dict(model[0].state_dict())
    for k, (cin, cout) in ((2, (8, 6)), (4, (6, 4))):
        w = model[k].weight.data
        grouped[k].weight.data = torch.cat([w[:cout // 2, :cin // 2], w[cout // 2:, cin // 2:]])
        grouped[k].bias.data = model[k].bias.data.clone()
    part = partition(model, x, 2)
    dm = DiscoModel(model, part, part.no_links()).eval()
    with torch.no_grad():
        assert rel_err(dm(x), grouped(x)) < 1e-6
    assert part.ratio(part.no_links()) == 0.0


def test_ownership_balanced_and_replicated_input():
    model = build_model("cifar_resnet20")
    part = partition(model, (1, 3, 32, 32), 3)
    assert (part.owner["x"] == REPLICATED).all()
    conv = part.owner["layer1_0_conv1"]
    assert np.bincount(conv).tolist() == [6, 5, 5]  # 16 channels over 3 nodes
    # the residual add couples its operands: same owner per channel
    add = next(n for n in part.gm.graph.nodes if n.op == "call_function" and "add" in n.name)
    a, b = (part.owner[x.name] for x in add.all_input_nodes)
    assert (a == b).all()
    assert split_owner(7, 4).tolist() == [0, 0, 1, 1, 2, 2, 3]


def test_concat_links_are_channels_of_the_operands():
    """A channel that reaches two convs through two concatenations is one link, not two."""

    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 4, 1)
            self.b = nn.Conv2d(4, 4, 1)
            self.c = nn.Conv2d(8, 4, 1)
            self.d = nn.Conv2d(12, 4, 1)

        def forward(self, x):
            a = self.a(x)
            b = self.b(a)
            c = self.c(torch.cat([a, b], 1))
            return self.d(torch.cat([a, b, c], 1))

    part = partition(Dense(), (1, 3, 5, 5), 2)
    # tensors a, b, c each 4 channels, each node receives the other's 2: 3 tensors * 4 links
    assert sorted(part.link_tensors) == ["a", "b", "c"]
    assert part.n_links == 12
    assert part.dense_values() == 12 * 25


def test_unsupported_op_names_op_and_module_path():
    class Inner(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, 1)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)
            self.inner = Inner()

        def forward(self, x):
            return self.inner(self.conv(x))

    with pytest.raises(UnsupportedOpError, match=r"cumsum.*inner"):
        partition(Outer(), (1, 3, 4, 4), 2)


def test_channel_reduction_is_refused_clearly():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            return self.conv(x).mean(1)

    with pytest.raises(UnsupportedOpError, match="reduces over the channel dim"):
        partition(M(), (1, 3, 4, 4), 2)


def test_bad_nodes():
    with pytest.raises(ValueError, match="nodes must be >= 1"):
        partition(build_model("cifar_resnet8"), (1, 3, 32, 32), 0)
