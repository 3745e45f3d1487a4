"""Rules for more architectures (issue 33 item 2), invariants 1-4 at N=2 and N=3 on tiny models: padding and
window reshapes that keep the channel dim, shifted windows (roll), token mixing (a Linear over tokens), GroupNorm
with one group (statistics exchanged) and with groups aligned to the nodes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from reference import check_invariants, randomize_bn, rel_err
from torch import nn

from disco.graph import UnsupportedOpError, partition
from disco.masks import DiscoModel


class SwinLike(nn.Module):
    """Channels-last windows: pad H and W (not C), shift by a roll, partition into windows, mix the tokens of
    each window (a Linear over the window's tokens), reverse the windows, roll back, crop."""

    def __init__(self, c: int = 12, ws: int = 2) -> None:
        super().__init__()
        self.ws = ws
        self.stem = nn.Conv2d(3, c, 2, stride=2)
        self.norm = nn.LayerNorm(c)
        self.tokens = nn.Linear(ws * ws, ws * ws)
        self.fc = nn.Linear(c, c)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).permute(0, 2, 3, 1)  # B, H, W, C
        b, h, w, c = x.shape
        ws = self.ws
        y = F.pad(self.norm(x), (0, 0, 0, 1, 0, 1))  # pads W and H, not C
        y = torch.roll(y, shifts=(-1, -1), dims=(1, 2))
        hp, wp = h + 1, w + 1
        win = y.view(b, hp // ws, ws, wp // ws, ws, c).permute(0, 1, 3, 5, 2, 4).reshape(-1, c, ws * ws)
        win = self.tokens(win)  # token mixing inside each window
        y = win.view(b, hp // ws, wp // ws, c, ws, ws).permute(0, 1, 4, 2, 5, 3).reshape(b, hp, wp, c)
        y = torch.roll(y, shifts=(1, 1), dims=(1, 2))[:, :h, :w, :]
        x = x + self.fc(y)
        return self.head(x.mean((1, 2)))


class MixerLike(nn.Module):
    """An MLP-Mixer block: token mixing (Linear over the tokens) and channel mixing."""

    def __init__(self, c: int = 12, tokens: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 2, stride=2)
        self.norm1, self.norm2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.tok1, self.tok2 = nn.Linear(tokens, 2 * tokens), nn.Linear(2 * tokens, tokens)
        self.ch1, self.ch2 = nn.Linear(c, 2 * c), nn.Linear(2 * c, c)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)  # B, T, C
        x = x + self.tok2(F.gelu(self.tok1(self.norm1(x).transpose(1, 2)))).transpose(1, 2)
        x = x + self.ch2(F.gelu(self.ch1(self.norm2(x))))
        return self.head(x.mean(1))


class LayerScale2d(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma.view(1, -1, 1, 1)


class PoolFormerLike(nn.Module):
    """A PoolFormer block: GroupNorm(groups, C), pooling minus identity, layer scale, a conv MLP."""

    def __init__(self, c: int = 12, groups: int = 1) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.norm1, self.norm2 = nn.GroupNorm(groups, c), nn.GroupNorm(groups, c)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.ls1, self.ls2 = LayerScale2d(c), LayerScale2d(c)
        self.fc1, self.fc2 = nn.Conv2d(c, 2 * c, 1), nn.Conv2d(2 * c, c, 1)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.norm1(x)
        x = x + self.ls1(self.pool(y) - y)
        x = x + self.ls2(self.fc2(F.gelu(self.fc1(self.norm2(x)))))
        return self.head(x.mean((2, 3)))


MODELS = {
    "swin_like": (SwinLike, (2, 3, 6, 6)),
    "mixer_like": (MixerLike, (2, 3, 8, 8)),
    "poolformer_like": (PoolFormerLike, (2, 3, 6, 6)),
    "poolformer_groups6": (lambda: PoolFormerLike(groups=6), (2, 3, 6, 6)),
}

try:  # timm's own blocks, tiny configurations (no download: random weights)
    from timm.layers.norm import GroupNorm1
    from timm.models.metaformer import MetaFormer, Pooling
    from timm.models.mlp_mixer import MlpMixer
    from timm.models.swin_transformer import SwinTransformer

    MODELS.update({
        "timm_swin": (lambda: SwinTransformer(img_size=32, patch_size=4, window_size=4, embed_dim=36, depths=(2, 2),
                                              num_heads=(3, 3), num_classes=5), (2, 3, 32, 32)),
        "timm_mixer": (lambda: MlpMixer(num_classes=5, img_size=32, patch_size=8, num_blocks=2, embed_dim=12),
                       (2, 3, 32, 32)),
        "timm_poolformer": (lambda: MetaFormer(depths=(1, 1), dims=(12, 24), token_mixers=Pooling,
                                               mlp_act=nn.GELU, use_mlp_head=False, norm_layers=GroupNorm1,
                                               num_classes=5), (2, 3, 32, 32)),
    })
except ImportError:  # pragma: no cover
    pass


def _model(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    make, shape = MODELS[name]
    model = randomize_bn(make())
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.LayerNorm, nn.GroupNorm)) and m.weight is not None:
                m.weight.uniform_(0.5, 1.5)
            if isinstance(m, (nn.LayerNorm, nn.GroupNorm)) and m.bias is not None:
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
def test_invariants_2_to_4(name: str, nodes: int) -> None:
    rep = check_invariants(*_model(name, seed=1), nodes)
    assert (rep.stats_bytes > 0) == (name != "poolformer_groups6")  # aligned groups exchange nothing


def test_groups_are_aligned_to_the_nodes() -> None:
    model, x = _model("poolformer_groups6")
    part = partition(model, x, 2)
    own = part.owner[next(n.name for n in part.gm.graph.nodes if n.target == "norm1")]
    assert all(len(set(own[g * 2:(g + 1) * 2].tolist())) == 1 for g in range(6))  # a group on one node


def test_padding_or_rolling_the_channel_dim_is_refused() -> None:
    class PadC(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = nn.Conv2d(3, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.pad(self.c(x), (0, 0, 0, 0, 0, 1))

    class RollC(PadC):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.roll(self.c(x), 1, 1)

    for m, msg in ((PadC(), "pads the channel dim"), (RollC(), "rolls along the channel dim")):
        with pytest.raises(UnsupportedOpError, match=msg):
            partition(m, (1, 3, 4, 4), 2)
