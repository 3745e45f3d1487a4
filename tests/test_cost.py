import re

import numpy as np
import pytest
from torch import nn

from disco.cost import estimate, format_table
from disco.graph import partition
from disco.models import build_model


def _chain():
    # conv(3->4, 3x3) -> BN -> ReLU -> conv(4->6, 1x1, no bias); input 1x3x8x8
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 6, 1, bias=False))


def test_small_chain_by_hand():
    part = partition(_chain().eval(), (1, 3, 8, 8), 2)
    rep = estimate(part)
    # one exchange: the ReLU output, 4 channels of 8x8; each node receives the other's 2 channels
    assert part.link_tensors == ["_2"]
    assert rep.dense_bytes == 4 * 64 * 4
    # input distribution: the 3x8x8 image to the one other node; output gather: node 1's 3 channels of 8x8
    assert rep.input_bytes == 3 * 64 * 4
    assert rep.output_bytes == 3 * 64 * 4
    # FLOPs: conv1 2*4*3*9*64, BN 2*4*64, ReLU 4*64, conv2 2*6*4*64
    conv1, bn, relu, conv2 = 2 * 4 * 3 * 9 * 64, 2 * 4 * 64, 4 * 64, 2 * 6 * 4 * 64
    assert rep.flops_dense == conv1 + bn + relu + conv2
    assert rep.flops_per_node == [(conv1 + bn + relu + conv2) // 2] * 2
    # weights: conv1 rows split 2/2 (27 weights + 1 bias each), BN 2 params/channel, conv2 3 rows of 4
    assert rep.params_per_node == [2 * 28 + 2 * 2 + 3 * 4] * 2
    assert rep.params_dense == 4 * 28 + 8 + 24


def test_small_chain_no_links():
    part = partition(_chain().eval(), (1, 3, 8, 8), 2)
    rep = estimate(part, part.no_links())
    conv1, bn, relu, conv2 = 2 * 4 * 3 * 9 * 64, 2 * 4 * 64, 4 * 64, 2 * 6 * 4 * 64
    assert rep.bytes == 0 and rep.ratio == 0
    assert rep.flops_total == conv1 + bn + relu + conv2 // 2  # conv2 reads only local halves
    assert rep.params_per_node == [2 * 28 + 2 * 2 + 3 * 2] * 2
    # one link kept: node 0 receives channel 2 of the ReLU output
    kept = part.no_links()
    k = np.nonzero((part.links.receiver == 0) & (part.links.channel == 2))[0][0]
    kept[k] = True
    rep = estimate(part, kept)
    assert rep.bytes == 64 * 4
    assert rep.params_per_node == [2 * 28 + 4 + 3 * 3, 2 * 28 + 4 + 3 * 2]
    assert rep.ratio == pytest.approx(0.25)


def test_grouped_conv_has_no_links_when_aligned():
    m = nn.Sequential(nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.Conv2d(8, 8, 3, groups=8))
    part = partition(m.eval(), (1, 3, 6, 6), 2)
    assert part.n_links == 0
    rep = estimate(part)
    assert rep.flops_per_node[0] == rep.flops_per_node[1]


@pytest.mark.slow
@pytest.mark.parametrize("nodes,factor", [(2, 1), (4, 3)])
def test_resnet50_dense_bytes_match_the_issue(nodes, factor):
    """torchvision resnet50 at 1x3x224x224: 8.91 M values (35.6 MB fp32) at N=2, three times that at N=4."""
    part = partition(build_model("resnet50"), (1, 3, 224, 224), nodes)
    rep = estimate(part)
    assert rep.dense_bytes == 8_908_288 * 4 * factor
    assert rep.flops_total == rep.flops_dense
    assert sum(rep.params_per_node) == rep.params_dense


def test_peak_memory_and_table():
    part = partition(_chain().eval(), (1, 3, 8, 8), 2)
    rep = estimate(part)
    # live at the conv2 step on a node: its 2 ReLU channels + 2 received + 3 output channels (8x8 fp32);
    # the input image (replicated, 3 channels) is freed after conv1 and conv1's output after BN: the peak
    assert rep.peak_activation_bytes_per_node == [(2 + 2 + 3) * 64 * 4] * 2
    text = format_table(rep)
    # conv2 (module "3") reads the 4x8x8 ReLU output through all 4 links: 1.0 KB dense and kept
    assert re.search(r"^3\s+4x8x8\s+4/4\s+1\.0\s+1\.0\s", text, re.M), text
    assert re.search(r"^0\s+3x8x8\s+0/0\s", text, re.M), text  # conv1 reads the replicated input: no links
    assert "ratio r = 1.0000" in text
