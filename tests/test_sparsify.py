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


def test_taylor_scores_are_finite_and_nonzero(dm):
    x = torch.randn(8, 3, 32, 32)
    y = torch.randint(0, 10, (8,))
    s = taylor_scores(dm, [(x, y)], torch.nn.functional.cross_entropy)
    assert s.shape == (dm.partition.n_links,) and np.isfinite(s).all() and (s > 0).any()


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
