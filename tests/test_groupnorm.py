"""GroupNorm called as a function (``F.group_norm`` on a module's weight and bias) split exactly, as the module
form is (issue 33 item 2): one group with its statistics exchanged, several groups aligned to the nodes;
invariants 1-4 at N=2 and N=3, the ONNX export's proof, and real node processes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from groupnorm_models import MODELS, GroupNormNet
from reference import check_invariants, rel_err
from torch import nn

from disco.cost import estimate
from disco.graph import UnsupportedOpError, partition
from disco.masks import DiscoModel

SHAPE = (2, 3, 6, 6)


def _model(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    return MODELS[name]().eval(), torch.randn(SHAPE)


def _one_group_stats_bytes(model: GroupNormNet, nodes: int) -> int:
    """Independently: a norm with one group sends the mean and M2 (fp32) per sample to every other node."""
    return sum(g == 1 for g in model.groups) * 2 * SHAPE[0] * 4 * nodes * (nodes - 1)


FUNCTIONAL = ["test_gn_functional_1", "test_gn_functional_4"]


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("name", FUNCTIONAL)
def test_invariant1_all_links_equals_original(name: str, nodes: int) -> None:
    model, x = _model(name)
    with torch.no_grad():
        ref = model(x)
    part = partition(model, x, nodes)
    assert any(n.target is F.group_norm for n in part.gm.graph.nodes)  # the function, not the module
    with torch.no_grad():
        assert rel_err(DiscoModel(model, part).eval()(x), ref) < 1e-5


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("name", FUNCTIONAL)
def test_invariants_2_to_4(name: str, nodes: int) -> None:
    model, x = _model(name, seed=1)
    rep = check_invariants(model, x, nodes)
    assert rep.stats_bytes == _one_group_stats_bytes(model, nodes)


@pytest.mark.parametrize("groups", [1, 4])
def test_the_function_splits_as_the_module(groups: int) -> None:
    """Same weights, the function or the module: the same output, owners and bytes (the function's weight
    is held whole by every node, the module's sliced: the parameter counts differ by that)."""
    torch.manual_seed(0)
    fn = GroupNormNet((groups, groups), (True, True)).eval()
    mod = GroupNormNet((groups, groups), (False, False)).eval()
    mod.load_state_dict(fn.state_dict(), strict=False)
    nn.init.ones_(mod.norm2.weight)  # the function's norm2 has no affine terms
    nn.init.zeros_(mod.norm2.bias)
    x = torch.randn(SHAPE)
    with torch.no_grad():
        assert rel_err(fn(x), mod(x)) < 1e-6
    pf, pm = partition(fn, x, 3), partition(mod, x, 3)
    kept = np.random.default_rng(0).random(pf.n_links) < 0.5
    ef, em = estimate(pf, kept), estimate(pm, kept)
    assert (ef.bytes, ef.stats_bytes) == (em.bytes, em.stats_bytes)
    norm = {"group_norm": "norm1", "group_norm_1": "norm2"}
    assert all(np.array_equal(pf.owner[f], pm.owner[m]) for f, m in norm.items())


def test_groups_are_aligned_to_the_nodes() -> None:
    model, x = _model("test_gn_functional_4")
    part = partition(model, x, 3)
    own = part.owner["group_norm"]
    assert all(len(set(own[g * 16:(g + 1) * 16].tolist())) == 1 for g in range(4))  # a group on one node
    assert len(set(own.tolist())) == 3


class _Refused(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how, self.conv, self.norm = how, nn.Conv2d(3, 8, 1), nn.GroupNorm(2, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.how == "groups":
            return F.group_norm(x, x.shape[1] // 4, self.norm.weight, self.norm.bias)
        return F.group_norm(x, 2, self.norm.weight * 2, self.norm.bias)


@pytest.mark.parametrize("how,msg", [("weight", "computes its weight in the graph")])
def test_groups_or_weights_computed_in_the_graph_are_refused(how: str, msg: str) -> None:
    with pytest.raises(UnsupportedOpError, match=msg):
        partition(_Refused(how), (1, 3, 4, 4), 2)


def test_groups_computed_from_the_input_shape_are_the_models_own() -> None:
    """``x.shape[1] // 4`` is a size of the input: resolved at capture for its shape (issue 43 item 3), so a node
    holding half the channels does not recompute it from its slice."""
    from disco.runtime.local import simulate

    torch.manual_seed(0)
    model, x = _Refused("groups").eval(), torch.randn(1, 3, 4, 4)
    out, _ = simulate(partition(model, x, 2), None, x)
    with torch.no_grad():
        assert rel_err(out, model(x)) < 1e-5


@pytest.mark.parametrize("name", FUNCTIONAL)
def test_onnx_export_is_proved(tmp_path: Path, name: str) -> None:
    """The functional models exported as ONNX segments: proved within 1e-4 in onnxruntime, and their schedules
    send the predicted link bytes and statistics."""
    from disco.runtime.onnx_export import export_onnx

    model, x = _model(name)
    part = partition(model, x, 2)
    kept = np.random.default_rng(1).random(part.n_links) < 0.4
    man = export_onnx(DiscoModel(model, part, kept), part, kept, tmp_path, {"name": name, "kwargs": {}})
    assert man["max_rel_err_onnx"] <= 1e-4
    rep = estimate(part, kept)
    sends = [s for j in range(2) for s in json.loads((tmp_path / f"rank{j}" / "schedule.json").read_text())["steps"]
             if s["op"] == "send"]
    sent = {k: sum(int(np.prod(s["shape"])) * 4 for s in sends if s["kind"] == k) for k in ("links", "stats")}
    assert sent == {"links": rep.bytes, "stats": rep.stats_bytes}
    assert rep.stats_bytes == _one_group_stats_bytes(model, 2)


@pytest.mark.dist
def test_node_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One run of real node processes (gloo on 127.0.0.1) on a model with a functional GroupNorm of 1 group
    (on a module's weight and bias) and a module one of 4 groups: the output is the model's own forward within
    1e-4, the bytes and statistics sent the predicted."""
    from disco.runtime.export import export
    from disco.runtime.launch import launch

    name, nodes = "test_gn_functional_1_module_4", 2
    model, x = _model(name)
    part = partition(model, x, nodes)
    kept = np.random.default_rng(2).random(part.n_links) < 0.4
    export(DiscoModel(model, part, kept), part, kept, tmp_path, {"name": name, "kwargs": {}})
    monkeypatch.setenv("DISCO_NODE_HOOKS", str(Path(__file__).with_name("groupnorm_models.py")))
    rep = launch(tmp_path, nodes, ["--warmup", "0", "--iters", "1", "--timeout", "10", "--startup-timeout", "30"],
                 timeout=120)
    est = estimate(part, kept)
    assert rep["max_rel_err_vs_single_process"] < 1e-4
    assert rep["bytes_sent_total"] == rep["bytes_predicted"] == est.bytes > 0
    assert rep["bytes_stats"] == rep["bytes_stats_predicted"] == est.stats_bytes == _one_group_stats_bytes(model, 2)
    assert rep["params_per_node"] == est.params_per_node
