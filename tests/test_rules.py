import pytest
import torch
from torch import nn

from disco.graph import partition
from disco.graph.ops import ConvRule, ConvTransposeRule, LinearRule
from disco.graph.registry import module_rule


@pytest.mark.parametrize("module", [
    nn.Conv2d(6, 4, 3, groups=2), nn.Conv2d(4, 8, 1), nn.Conv2d(4, 8, 3, groups=4),
    nn.ConvTranspose2d(6, 4, 2, groups=2), nn.ConvTranspose2d(4, 6, 3), nn.Linear(5, 3),
])
def test_to_oi_from_oi_roundtrip(module):
    rule = module_rule(type(module))
    o, i, g = rule.structure(module)
    struct = (torch.arange(o) // (o // g))[:, None] == (torch.arange(i) // (i // g))[None, :]
    m = (torch.rand(o, i) < 0.5) & struct
    w = rule.from_oi(module, m.float())
    assert w.shape == module.weight.shape
    back = rule.to_oi(module, w)
    k = module.weight[0, 0].numel()
    assert torch.equal(back, m.float() * k)
    assert torch.equal(rule.to_oi(module, torch.ones_like(module.weight)) > 0, struct)


def test_registry_covers_subclasses_and_types():
    class MyConv(nn.Conv2d):
        pass

    assert isinstance(module_rule(MyConv), ConvRule)
    assert isinstance(module_rule(nn.ConvTranspose2d), ConvTransposeRule)
    assert isinstance(module_rule(nn.Linear), LinearRule)
    assert module_rule(nn.LSTM) is None


def test_conv_transpose_links():
    m = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ConvTranspose2d(4, 6, 2, stride=2)).eval()
    part = partition(m, (1, 3, 4, 4), 2)
    ly = part.layers[1]
    assert ly.macs_per_connection == 2 * 2 * 4 * 4  # kernel x input plane
    assert part.n_links == 4 and part.dense_values() == 4 * 16


def test_flatten_of_spatial_maps_links_whole_planes():
    """VGG-style flatten: a Linear reading C x H x W features needs each remote channel's plane."""
    m = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 9, 5)).eval()
    part = partition(m, (1, 3, 3, 3), 2)
    assert part.n_links == 4 and set(part.links.values.tolist()) == {9}
    ly = part.layers[1]
    # column f of the Linear reads channel f // 9: node 0 reads columns 18..35 through links
    assert (ly.col_link[0, :18] == -1).all() and (ly.col_link[0, 18:] >= 0).all()
    assert len(set(ly.col_link[0, 18:].tolist())) == 2  # two links (channels 2, 3), 9 columns each
