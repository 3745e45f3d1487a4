"""Vision transformers through the same registry: head-split attention, exact LayerNorm, token channels."""

import copy

import numpy as np
import pytest
import torch
from reference import reference_forward, rel_err

from disco.cost import estimate
from disco.graph import UnsupportedOpError, partition
from disco.graph.capture import capture
from disco.masks import DiscoModel
from disco.models import build_model
from disco.runtime.local import simulate

timm = pytest.importorskip("timm")

# (model, input, N values the head count allows); timm models at 64x64 (16 patches) to stay fast
CASES = [
    ("deit_tiny_patch16_224", (1, 3, 64, 64), [2, 3]),  # 3 heads: over 2 nodes as 2 + 1
    ("deit_tiny_distilled_patch16_224", (1, 3, 64, 64), [3]),
    ("deit_small_patch16_224", (1, 3, 64, 64), [2, 3, 4]),  # 6 heads: over 4 nodes as 2 + 2 + 1 + 1
    ("vit_tiny_test", (2, 3, 32, 32), [2, 4]),  # 4 heads
    ("vit_b_16", (1, 3, 64, 64), [2, 3, 4]),  # torchvision, nn.MultiheadAttention, 12 heads
]


def _build(name, shape):
    if name.startswith("deit"):
        return build_model(name, img_size=shape[-1]).eval()
    if name == "vit_b_16":
        model = build_model(name, image_size=shape[-1]).eval()
        torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision starts the head at zero
        return model
    return build_model(name).eval()


@pytest.mark.parametrize("name,shape,ns", CASES, ids=[c[0] for c in CASES])
def test_invariant1_and_activation_reference(name, shape, ns):
    torch.manual_seed(0)
    for n in ns:
        model = _build(name, shape)
        x = torch.randn(shape)
        plain = copy.deepcopy(model)
        with torch.no_grad():
            ref = model(x)
        part = partition(model, x, n)
        dm = DiscoModel(model, part).eval()
        with torch.no_grad():
            assert rel_err(dm(x), ref) < 1e-5  # invariant 1
        kept = np.random.default_rng(n).random(part.n_links) < 0.3
        dm.set_kept(kept)
        with torch.no_grad():
            out = dm(x)
            assert rel_err(out, reference_forward(part, capture(plain, x), kept, x)) < 1e-5
            assert rel_err(out, ref) > 1e-3  # the masks do change the function


def test_heads_stay_whole_and_qkv_share_links():
    model = _build("deit_small_patch16_224", (1, 3, 64, 64))
    part = partition(model, (1, 3, 64, 64), 2)
    qkv = part.layer("blocks.0.attn.qkv")
    own = qkv.out_owner.reshape(3, 6, 64)  # [q/k/v, head, channel]
    assert (own == own[0:1]).all() and (own == own[:, :, :1]).all()  # a head's q, k, v on one node
    assert own[0, :, 0].tolist() == [0, 0, 0, 1, 1, 1]
    # the link a node receives for a channel of the block input serves q, k and v (one Linear)
    proj = part.layer("blocks.0.attn.proj")
    assert proj.input != qkv.input
    assert len(part.links) == len(np.unique(np.stack([part.links.tensor, part.links.receiver,
                                                      part.links.channel]), axis=1).T)


@pytest.mark.parametrize("name,n,heads", [("deit_tiny_patch16_224", 4, 3), ("vit_tiny_test", 5, 4)])
def test_fewer_heads_than_nodes_is_a_clear_error(name, n, heads):
    with pytest.raises(UnsupportedOpError, match=f"has {heads} attention heads, fewer than N={n}"):
        partition(_build(name, (1, 3, 64, 64) if name.startswith("deit") else (1, 3, 32, 32)), (1, 3, 64, 64)
                  if name.startswith("deit") else (1, 3, 32, 32), n)


def test_uneven_heads_stay_whole():
    part = partition(_build("deit_small_patch16_224", (1, 3, 64, 64)), (1, 3, 64, 64), 4)
    own = part.layer("blocks.0.attn.qkv").out_owner.reshape(3, 6, 64)
    assert (own == own[0:1]).all() and (own == own[:, :, :1]).all()
    assert own[0, :, 0].tolist() == [0, 0, 1, 1, 2, 3]


def test_multihead_attention_projection_is_one_mixing_op_on_in_proj_weight():
    """nn.MultiheadAttention: the fused q/k/v projection is a mixing layer on ``in_proj_weight``
    (one link serves q, k and v), heads stay whole, and the masks live on that parameter."""
    model = _build("vit_b_16", (1, 3, 32, 32))
    part = partition(model, (1, 3, 32, 32), 4)
    path = "encoder.layers.encoder_layer_0.self_attention"
    ly = part.layer(f"{path}.in_proj_weight")
    assert (ly.name, ly.param, ly.bias) == (path, "in_proj_weight", "in_proj_bias")
    own = ly.out_owner.reshape(3, 12, 64)
    assert (own == own[0:1]).all() and (own == own[:, :, :1]).all()
    assert own[0, :, 0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    dm = DiscoModel(model, part, part.no_links())
    mha = model.get_submodule(path)
    assert "in_proj_weight" in mha.parametrizations
    w = mha.in_proj_weight.detach()
    x_owner = part.owner[ly.input]
    assert (w[:, x_owner != 0][ly.out_owner == 0] == 0).all() and (w[:, x_owner == 0][ly.out_owner == 0] != 0).any()
    assert f"{path}.in_proj_weight" in dm.plain_state_dict()


def test_multihead_attention_unsupported_uses_are_named():
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True)

    class Cross(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.attn = torch.nn.Linear(16, 16), mha

        def forward(self, x):
            return self.attn(x, self.proj(x), self.proj(x))[0]

    with pytest.raises(UnsupportedOpError, match="MultiheadAttention.*distinct query, key and value"):
        partition(Cross(), (1, 5, 16), 2)


@pytest.mark.parametrize("n", [2, 4])
def test_runtime_invariants_and_layernorm_statistics(n):
    """Invariants 2 and 3 for a ViT, and the LayerNorm statistics counted apart, exactly."""
    torch.manual_seed(0)
    model = build_model("vit_tiny_test").eval()
    x = torch.randn(1, 3, 32, 32)
    part = partition(model, x, n)
    kept = np.random.default_rng(1).random(part.n_links) < 0.2
    dm = DiscoModel(model, part, kept).eval()
    with torch.no_grad():
        ref = dm(x)
    out, trs = simulate(part, kept, x, timeout=20)
    rep = estimate(part, kept)
    assert rel_err(out, ref) < 1e-4
    assert sum(t.payload_bytes for t in trs) == rep.bytes
    # 5 LayerNorms (2 per block + final) x 65 tokens x (mean, M2) x N x (N-1) x 4 bytes
    assert sum(t.stats_bytes for t in trs) == rep.stats_bytes == 5 * 65 * 2 * n * (n - 1) * 4


def test_runtime_with_uneven_heads():
    """deit_tiny (3 heads) over 2 nodes: 2 + 1 heads; invariants 2 and 3 hold."""
    torch.manual_seed(0)
    model = _build("deit_tiny_patch16_224", (1, 3, 64, 64))
    x = torch.randn(1, 3, 64, 64)
    part = partition(model, x, 2)
    kept = np.random.default_rng(2).random(part.n_links) < 0.2
    dm = DiscoModel(model, part, kept).eval()
    with torch.no_grad():
        ref = dm(x)
    out, trs = simulate(part, kept, x, timeout=20)
    assert rel_err(out, ref) < 1e-4
    assert sum(t.payload_bytes for t in trs) == estimate(part, kept).bytes


def test_latency_trace_covers_layernorm_statistics():
    """The latency model's trace transport takes the statistics messages of channel reductions too."""
    from disco.runtime.latency import trace_plan

    x = torch.randn(1, 3, 32, 32)
    part = partition(build_model("vit_tiny_test").eval(), x, 2)
    progs = trace_plan(part, None, x, reps=1, warmup=0)
    assert len(progs) == 2 and all(progs)


@pytest.mark.slow
def test_vit_cost_counts_attention_and_stats():
    part = partition(build_model("deit_small_patch16_224"), (1, 3, 224, 224), 2)
    rep = estimate(part)
    assert 9.0e9 < rep.flops_dense < 9.6e9  # DeiT-S at 224: 4.6 G multiply-accumulates
    # parameters used directly (position embedding, class token) are held whole by every node
    replicated = 197 * 384 + 384
    assert sum(rep.params_per_node) == rep.params_dense + replicated
    assert rep.stats_bytes == 25 * 197 * 2 * 2 * 1 * 4
