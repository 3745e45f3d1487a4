import numpy as np
import pytest
import torch

from disco.graph import partition
from disco.masks import DiscoModel
from disco.models import build_model
from disco.sparsify import cubic_ratio, magnitude_scores, random_scores, select_links, taylor_scores
from disco.sparsify.prune import GradualPruner


@pytest.fixture(scope="module")
def dm():
    torch.manual_seed(0)
    model = build_model("cifar_resnet20")
    part = partition(model, (1, 3, 32, 32), 2)
    return DiscoModel(model, part)


@pytest.mark.parametrize("ratio", [0.0, 0.05, 0.1, 0.2, 0.5, 1.0])
@pytest.mark.parametrize("budget", ["global", "layer"])
def test_achieved_ratio_within_001(dm, ratio, budget):
    kept = select_links(dm.partition, magnitude_scores(dm), ratio, budget)
    assert abs(dm.partition.ratio(kept) - ratio) <= 0.01


def test_global_budget_ranks_by_score_per_byte(dm):
    part = dm.partition
    scores = np.ones(part.n_links)
    kept = select_links(part, scores, 0.1, "global")
    # equal scores: cheaper (smaller plane) links have more score per byte and win
    assert part.links.values[kept].max() <= np.median(part.links.values)


def test_layer_budget_keeps_the_share_of_every_tensor(dm):
    part = dm.partition
    kept = select_links(part, random_scores(part.n_links), 0.25, "layer")
    for t in range(len(part.link_tensors)):
        idx = part.links.tensor == t
        assert abs(kept[idx].sum() - 0.25 * idx.sum()) < 1


def test_within_never_regrows(dm):
    part = dm.partition
    s = magnitude_scores(dm)
    first = select_links(part, s, 0.5)
    second = select_links(part, -s, 0.2, within=first)
    assert not (second & ~first).any()


def test_magnitude_score_by_hand():
    conv = torch.nn.Conv2d(2, 2, 1, bias=False)
    conv.weight.data = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).view(2, 2, 1, 1)
    part = partition(torch.nn.Sequential(torch.nn.Conv2d(3, 2, 1), conv), (1, 3, 4, 4), 2)
    d = DiscoModel(part.gm, part)
    s = magnitude_scores(d)
    # links: node 0 (owns out 0) receives channel 1 -> weight 2.0; node 1 receives channel 0 -> weight 3.0
    got = {(int(r), int(c)): v for r, c, v in zip(part.links.receiver, part.links.channel, s, strict=True)}
    assert got == {(0, 1): pytest.approx(2.0), (1, 0): pytest.approx(3.0)}


def test_taylor_score_by_hand():
    """|sum of w * dL/dw| over a link's weights per batch, averaged over the batches."""
    first = torch.nn.Conv2d(3, 2, 1, bias=False)
    first.weight.data = torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]).view(2, 3, 1, 1)  # h0 = x0, h1 = x1
    conv = torch.nn.Conv2d(2, 2, 1, bias=False)
    conv.weight.data = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).view(2, 2, 1, 1)
    part = partition(torch.nn.Sequential(first, conv), (1, 3, 4, 4), 2)
    d = DiscoModel(part.gm, part)

    def batch(x0: float, x1: float) -> tuple:
        x = torch.zeros(1, 3, 4, 4)
        x[:, 0], x[:, 1] = x0, x1
        return x, None

    # loss = sum of the output: dL/dW2[o, i] = sum of h_i over the 16 positions
    s = taylor_scores(d, [batch(1.0, 2.0), batch(0.5, -1.0)], lambda out, y: out.sum())
    got = {(int(r), int(c)): v for r, c, v in zip(part.links.receiver, part.links.channel, s, strict=True)}
    # node 0 receives channel 1 (weight 2.0): |2 * 32| and |2 * -16|; node 1 receives channel 0 (weight 3.0):
    # |3 * 16| and |3 * 8|
    assert got == {(0, 1): pytest.approx((64 + 32) / 2), (1, 0): pytest.approx((48 + 24) / 2)}
    assert all(p.grad is None for p in d.parameters())  # leaves no gradients behind


def test_cubic_schedule():
    rs = [cubic_ratio(s, 100, 0.1) for s in range(0, 101, 10)]
    assert rs[0] == 1.0 and rs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(rs, rs[1:], strict=False))


def test_pruner_reaches_target_and_masks_follow():
    torch.manual_seed(0)
    model = build_model("cifar_resnet8")
    part = partition(model, (1, 3, 32, 32), 2)
    d = DiscoModel(model, part)
    pr = GradualPruner(d, 0.1, prune_steps=10, every=2)
    for step in range(1, 13):
        pr(step, 12)
    assert pr.done and abs(d.ratio - 0.1) <= 0.01
    # pruned weight columns are zero in the effective weights
    ly = part.layers[2]
    w = d.model.get_submodule(ly.name).weight
    mask = torch.from_numpy(ly.connection_mask(d.kept))
    assert (w.abs().sum((2, 3))[~mask] == 0).all()
    state = pr.state_dict()
    d.set_kept(part.all_links())
    pr.load_state_dict(state)
    assert abs(d.ratio - 0.1) <= 0.01


def test_separated_and_random_baselines_share_the_code(dm):
    part = dm.partition
    assert not select_links(part, magnitude_scores(dm), 0.0).any()
    a = select_links(part, random_scores(part.n_links, 1), 0.1)
    b = select_links(part, magnitude_scores(dm), 0.1)
    assert abs(part.ratio(a) - part.ratio(b)) <= 0.01 and (a != b).any()


def test_bad_arguments(dm):
    with pytest.raises(ValueError, match="ratio"):
        select_links(dm.partition, magnitude_scores(dm), 1.5)
    with pytest.raises(ValueError, match="budget"):
        select_links(dm.partition, magnitude_scores(dm), 0.1, "uniform")
    with pytest.raises(ValueError, match="selection"):
        GradualPruner(dm, 0.1, 10, selection="best")


def _lasso_model():
    """conv(3->2) -> conv A (2->2) -> avgpool 2 -> conv B (2->4), 1x1 kernels, N=2.

    Links: A's input (4x4 planes, 16 values): node 0 reads channel 1 through A[0, 1] = 2, node 1 reads
    channel 0 through A[1, 0] = 3. B's input (2x2 planes, 4 values): node 0 (rows 0, 1) reads channel 1
    through B[0:2, 1] = (3, 4), norm 5; node 1 (rows 2, 3) reads channel 0 through B[2:4, 0] = (6, 8), norm 10.
    Byte weights alpha = values / mean(values) = 16/10, 16/10, 4/10, 4/10.
    """
    from disco.sparsify.lasso import GroupLasso

    a = torch.nn.Conv2d(2, 2, 1, bias=False)
    a.weight.data = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).view(2, 2, 1, 1)
    b = torch.nn.Conv2d(2, 4, 1, bias=False)
    b.weight.data = torch.tensor([[1.0, 3.0], [2.0, 4.0], [6.0, 5.0], [8.0, 7.0]]).view(4, 2, 1, 1)
    part = partition(torch.nn.Sequential(torch.nn.Conv2d(3, 2, 1), a, torch.nn.AvgPool2d(2), b), (1, 3, 4, 4), 2)
    d = DiscoModel(part.gm, part)
    return d, GroupLasso(d)


def _weights(d):
    return [d.model.get_submodule(ly.name).parametrizations.weight.original.detach().flatten().tolist()
            for ly in d.partition.layers[1:]]


def test_group_lasso_penalty_and_gradient_by_hand():
    d, g = _lasso_model()
    assert g.alpha.tolist() == pytest.approx([1.6, 1.6, 0.4, 0.4])
    assert sorted(g.norms().tolist()) == pytest.approx([2.0, 3.0, 5.0, 10.0])
    p = g.penalty(0.5)
    assert p.item() == pytest.approx(0.5 * (1.6 * (2 + 3) + 0.4 * (5 + 10)))  # 7.0
    p.backward()
    grads = [d.model.get_submodule(ly.name).parametrizations.weight.original.grad.flatten().tolist()
             for ly in d.partition.layers[1:]]
    # d/dw of lam * alpha * ||w_l||: lam * alpha * w / ||w_l||; own-node columns get nothing
    assert grads[0] == pytest.approx([0.0, 0.8, 0.8, 0.0])
    assert grads[1] == pytest.approx([0.0, 0.2 * 3 / 5, 0.0, 0.2 * 4 / 5, 0.2 * 6 / 10, 0.0, 0.2 * 8 / 10, 0.0])


def test_group_lasso_proximal_step_by_hand():
    d, g = _lasso_model()
    # soft-threshold at step * alpha: A links 2 -> 2 - 1.6 = 0.4, 3 -> 1.4; B groups shrink by 0.4 in norm
    assert g.prox(1.0) == 0
    assert _weights(d)[0] == pytest.approx([1.0, 0.4, 1.4, 4.0])
    assert _weights(d)[1] == pytest.approx([1.0, 3 * 0.92, 2.0, 4 * 0.92, 6 * 0.96, 5.0, 8 * 0.96, 7.0])
    # a larger step zeroes both A links (threshold 3.2 > 1.4), and the B group of norm 4.6 shrinks to 4.6 - 0.8
    only = np.array([True, True, True, False])  # the last link is exempt
    assert g.prox(2.0, only) == 2
    w = _weights(d)
    assert w[0] == pytest.approx([1.0, 0.0, 0.0, 4.0])
    assert w[1] == pytest.approx([1.0, 3 * 0.92 * 3.8 / 4.6, 2.0, 4 * 0.92 * 3.8 / 4.6, 6 * 0.96, 5.0, 8 * 0.96, 7.0])


def test_lasso_pruner_shrinks_what_the_budget_would_drop_then_prunes():
    torch.manual_seed(0)
    model = build_model("cifar_resnet8")
    part = partition(model, (1, 3, 32, 32), 2)
    d = DiscoModel(model, part)
    before = magnitude_scores(d)
    inside = select_links(part, before, 0.1)  # the budget's choice at the target now
    pr = GradualPruner(d, 0.1, prune_steps=10, every=2, selection="lasso", lasso=0.5, lr_at=lambda s: 0.1)
    for step in range(1, 6):  # the penalty phase (half the pruning steps): nothing pruned
        pr(step, 12)
        assert d.kept.all()
    after = magnitude_scores(d)
    # the links the budget keeps are untouched; every other one shrank (strength 0.5 * step/5, step 0.1)
    assert np.array_equal(after[inside], before[inside])
    out = ~inside & (before > 0)
    assert (after[out] < before[out] - 1e-9).all()
    # a group soft-thresholded 5 times loses sum_k 0.1 * 0.5 * k/5 * alpha = 0.15 * alpha of its norm (or all of it)
    alpha = part.links.values / part.links.values.mean()
    assert after[out] == pytest.approx(np.maximum(0.0, before[out] - 0.15 * alpha[out]), abs=1e-6)
    for step in range(6, 13):
        pr(step, 12)
    assert pr.done and abs(d.ratio - 0.1) <= 0.01
    with pytest.raises(ValueError, match="lr_at"):
        GradualPruner(d, 0.1, 10, selection="lasso")


def test_link_costs_by_hand():
    """FLOPs and weights each link brings to its receiver, and the r=0 floor, on the tiny two-conv model."""
    from disco.cost import estimate
    from disco.sparsify.select import link_costs

    d, _ = _lasso_model()
    part = d.partition
    c = link_costs(part)
    # A (1x1 on 4x4, one row per node): 2 * 16 MACs, 1 weight; B (1x1 on 2x2, two rows per node): 2 * 4 * 2, 2 weights
    assert c.flops.tolist() == [32, 32, 16, 16] and c.weights.tolist() == [1, 1, 2, 2]
    assert sorted(c.exchange.tolist()) == [0, 1, 2, 3]
    # floor per node: first conv row (3 weights + bias) + A's own column + B's own column of two rows
    assert c.weights_floor.tolist() == [7, 7] and c.params_dense == 20
    for kept in ([True, False, False, True], [False, True, True, True]):
        rep = estimate(part, np.array(kept))
        assert rep.flops_total == c.flops_floor + c.flops[kept].sum()
        assert rep.params_per_node == (c.weights_floor + np.bincount(part.links.receiver[kept],
                                                                     weights=c.weights[kept], minlength=2)).tolist()


def test_messages_per_inference_by_hand():
    """Input to node 1, one message per (tensor, sender, receiver) with a kept link, node 1's output channels."""
    from disco.cost import estimate

    d, _ = _lasso_model()
    part = d.partition
    assert estimate(part, part.no_links()).messages_per_inference == 1 + 0 + 1
    assert estimate(part, np.array([True, False, False, True])).messages_per_inference == 1 + 2 + 1
    assert estimate(part).messages_per_inference == 1 + 4 + 1


def test_joint_budget_caps_by_hand():
    from disco.cost import estimate
    from disco.sparsify.select import link_costs

    d, _ = _lasso_model()
    part = d.partition
    c = link_costs(part)
    # weights cap 0.4 x 20 = 8 per node: 1 weight of room above the floor of 7, so no B link (2 weights);
    # bytes 0.5 x 40 = 20: only one A link (16 values); the better-scoring one (link 1) wins
    kept = select_links(part, np.array([1.0, 2.0, 1.0, 1.0]), 0.5, "joint", max_flops=1.0, max_weights_per_node=0.4)
    assert kept.tolist() == [False, True, False, False]
    assert max(estimate(part, kept).params_per_node) <= 8
    # FLOPs cap: 32 FLOPs of room above the floor. At price 0 both B links fit (8 values, 32 FLOPs); a price on
    # FLOPs trades them for one A link that moves 16 values for the same 32 FLOPs (the byte budget fills more)
    cap = (c.flops_floor + 32) / c.flops_dense
    kept = select_links(part, np.ones(4), 1.0, "joint", max_flops=cap, max_weights_per_node=1.0)
    assert kept.tolist() == [True, False, False, False]
    assert estimate(part, kept).flops_total <= cap * c.flops_dense
    with pytest.raises(ValueError, match="cannot be met by any choice of links"):
        select_links(part, np.ones(4), 0.5, "joint", max_flops=0.9 * c.flops_floor / c.flops_dense)
    with pytest.raises(ValueError, match="cannot be met by any choice of links"):
        select_links(part, np.ones(4), 0.5, "joint", max_flops=1.0, max_weights_per_node=0.3)  # floor 7/20


def test_latency_weight_fills_fewer_messages_by_hand():
    """N=2, a 4-channel 1x1 conv: node 0 receives channels 2, 3 (one message), node 1 channels 0, 1 (another).

    Scores (receiver, channel): (0, 2) 4, (0, 3) 1, (1, 0) 3, (1, 1) 2.9; room for two links (r = 0.5).
    By score per byte the best two are (0, 2) and (1, 0): two messages. Charging 100 values per message,
    (0, 2) opens node 0's message, after which (0, 3) costs only its 16 values: 1/16 beats 3/(16+100).
    """
    from disco.cost import estimate

    a = torch.nn.Conv2d(4, 4, 1, bias=False)
    part = partition(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), a), (1, 3, 4, 4), 2)
    pairs = list(zip(part.links.receiver.tolist(), part.links.channel.tolist(), strict=True))
    want = {(0, 2): 4.0, (0, 3): 1.0, (1, 0): 3.0, (1, 1): 2.9}
    scores = np.array([want[p] for p in pairs])
    plain = select_links(part, scores, 0.5)
    assert {p for p, k in zip(pairs, plain, strict=True) if k} == {(0, 2), (1, 0)}
    charged = select_links(part, scores, 0.5, latency_weight=100)
    assert {p for p, k in zip(pairs, charged, strict=True) if k} == {(0, 2), (0, 3)}
    assert part.ratio(charged) == part.ratio(plain) == 0.5  # the same bytes
    # input to node 1 + link messages + node 1's output channels
    assert estimate(part, plain).messages_per_inference == 1 + 2 + 1
    assert estimate(part, charged).messages_per_inference == 1 + 1 + 1
    with pytest.raises(ValueError, match="global budget"):
        select_links(part, scores, 0.5, "layer", latency_weight=100)


def test_joint_lasso_weights_by_hand():
    """--lasso-weight joint: each group charged its share of the byte, FLOPs and weight rooms.

    On the tiny two-conv model at r=0.5, FLOPs cap 1.0, weights cap 0.5: rooms 20 values, 96 FLOPs (every link's
    FLOPs: 32+32+16+16), 10-7 = 3 weights per node. A link: 16/20 + 32/96 + 1/3 = 22/15; B link: 4/20 + 16/96 +
    2/3 = 31/30; as lasso alphas (mean 5/4): 88/75 and 62/75 (bytes alone gave 1.6 and 0.4).
    """
    from disco.sparsify.lasso import GroupLasso
    from disco.sparsify.select import joint_weights, link_costs

    d, _ = _lasso_model()
    w = joint_weights(d.partition, 0.5, 1.0, 0.5, link_costs(d.partition))
    assert w.tolist() == pytest.approx([22 / 15, 22 / 15, 31 / 30, 31 / 30])
    assert GroupLasso(d, w).alpha.tolist() == pytest.approx([88 / 75, 88 / 75, 62 / 75, 62 / 75])
    with pytest.raises(ValueError, match="non-negative"):
        GroupLasso(d, -w)


def test_joint_lasso_weight_needs_the_joint_budget():
    from disco.sparsify.run import SparsifyConfig, _lasso_weights

    d, _ = _lasso_model()
    with pytest.raises(ValueError, match="needs the joint budget"):
        _lasso_weights(d.partition, SparsifyConfig(lasso_weight="joint"), {})
    with pytest.raises(ValueError, match="must be one of"):
        _lasso_weights(d.partition, SparsifyConfig(lasso_weight="flops"), {})
    assert _lasso_weights(d.partition, SparsifyConfig(), {}) is None
