"""The public API re-exported from ``disco`` (src/disco/api.py), and the README's example of it."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import disco
from disco.models import build_model

ROOT = Path(__file__).resolve().parents[1]


def test_import_disco_is_light_and_exports_the_api():
    code = ("import sys, disco; heavy = [m for m in ('torch', 'numpy', 'torchvision') if m in sys.modules]; "
            "assert not heavy, heavy; print(disco.partition, disco.sparsify_model, disco.export, disco.run)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "<function partition" in out and "<function run" in out
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        disco.nope  # noqa: B018


def test_api_names_are_not_shadowed_by_submodules():
    """A submodule imported later becomes an attribute of the package: no API name may be one."""
    import pkgutil

    import disco.api

    for m in pkgutil.walk_packages(disco.__path__, "disco."):
        __import__(m.name)
    for name in disco.__all__:
        if name != "__version__":
            assert getattr(disco, name) is getattr(disco.api, name), name


def _tiny():
    return build_model("cifar_resnet8"), (1, 3, 16, 16)


def test_partition_passes_unequal_shares_on():
    model, shape = _tiny()
    part = disco.partition(model, shape, 2, shares=[2, 1])
    owned = np.bincount(part.layers[0].out_owner, minlength=2)  # the stem convolution's 16 channels
    assert owned.sum() == 16 and owned[0] > owned[1] and abs(owned[0] - 2 * owned[1]) <= 2


def test_select_links_and_estimate_follow_the_model_kept_set():
    model, shape = _tiny()
    dm = disco.DiscoModel(model, disco.partition(model, shape, nodes=2))
    assert disco.estimate(dm).ratio == 1.0  # a new DISCO model keeps every link
    kept = disco.select_links(dm, 0.2)
    assert kept.dtype == bool and 0 < kept.sum() < kept.size
    dm.set_kept(kept)
    rep = disco.estimate(dm)
    assert 0.19 <= rep.ratio <= 0.2  # the global budget fills up to the target, never over
    assert disco.estimate(dm.partition).ratio == 1.0  # a bare partition: dense within-layer parallelism
    assert disco.estimate(dm, bytes_per_value=2).bytes * 2 == rep.bytes
    rnd = disco.select_links(dm, 0.2, scores="random", seed=1)
    assert not np.array_equal(rnd, kept) and disco.estimate(dm, rnd).ratio <= 0.2
    layer = disco.select_links(dm, 0.0, budget="layer")
    assert not layer.any()
    with pytest.raises(ValueError, match="scores must be"):
        disco.select_links(dm, 0.2, scores="taylor")
    with pytest.raises(TypeError, match="DiscoModel or a Partition"):
        disco.estimate(model)


def _loaders(n_batches=3, batch=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    batches = [(torch.randn(batch, 3, 16, 16, generator=g), torch.randint(0, 10, (batch,), generator=g))
               for _ in range(n_batches)]

    def top1(model, loader):
        with torch.no_grad():
            hits = sum((model(x).argmax(1) == y).sum().item() for x, y in loader)
        return {"top1": 100.0 * hits / sum(len(y) for _, y in loader)}

    return disco.Loaders(train=batches, test=batches[:1], evaluate=top1)


def test_sparsify_model_in_memory_reaches_the_ratio_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, _ = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = disco.SparsifyConfig(nodes=2, ratio=0.1, epochs=1, every=1, lr=0.01)
    dm, res = disco.sparsify_model(model, _loaders(), cfg)
    assert isinstance(dm, disco.DiscoModel) and dm.model is model  # in place
    assert dm.partition.input_shape == (1, 3, 16, 16)  # taken from the first training batch
    assert 0.09 <= res["ratio"] <= 0.1 and abs(dm.ratio - res["ratio"]) < 1e-12
    assert res["selection"] == "lasso" and "top1" in res  # the default (best measured)
    assert res["bytes"] == disco.estimate(dm).bytes
    assert any(not torch.equal(before[k], v) for k, v in dm.plain_state_dict().items() if k in before)  # trained
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_taylor_selection_takes_structured_targets():
    """Taylor scores on batches whose targets are a list of dicts (detection's), as the loss takes them."""
    model, _ = _tiny()
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 3, 16, 16, generator=g),
                [{"labels": torch.randint(0, 10, (1,), generator=g)} for _ in range(4)]) for _ in range(2)]

    def loss(out, targets):
        return F.cross_entropy(out, torch.cat([t["labels"] for t in targets]))

    cfg = disco.SparsifyConfig(nodes=2, ratio=0.2, epochs=1, every=1, lr=0.01, selection="taylor")
    dm, res = disco.sparsify_model(model, disco.Loaders(train=batches, loss=loss), cfg)
    assert res["selection"] == "taylor" and 0.15 <= dm.ratio <= 0.2


def test_sparsify_model_refuses_distillation_without_its_loss():
    model, _ = _tiny()
    with pytest.raises(ValueError, match="distillation loss"):
        disco.sparsify_model(model, _loaders(), disco.SparsifyConfig(ratio=0.1, epochs=1, distill=0.5))
    with pytest.raises(ValueError, match="dataset folder"):
        disco.sparsify_model(model, "cifar10", disco.SparsifyConfig(ratio=0.1, epochs=1))


def test_export_needs_the_architecture_and_run_refuses_what_does_not_fit(tmp_path):
    model, shape = _tiny()
    dm = disco.DiscoModel(model.train(), disco.partition(model, shape, nodes=2))
    with pytest.raises(ValueError, match="arch="):
        disco.export(dm, tmp_path / "x")
    man = disco.export(dm, tmp_path / "x", arch="cifar_resnet8")
    assert not dm.training  # exported for inference: the reference is computed in eval mode
    assert man["nodes"] == 2 and man["model"] == {"name": "cifar_resnet8", "kwargs": {}}
    with pytest.raises(ValueError, match="exported for 2 nodes, not 3"):
        disco.run(tmp_path / "x", nodes=3)
    with pytest.raises(TypeError, match="unknown run option.*bandwith"):
        disco.run(tmp_path / "x", nodes=2, bandwith="10mbit")
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((1, 3, 8, 8), dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        disco.run(tmp_path / "x", nodes=2, input=str(bad))


def test_run_options_become_node_flags():
    from disco.runtime.options import RunOptions

    assert RunOptions.from_kwargs(codec="fp16", bandwidth="100mbit", startup_timeout=5, limit=None).to_argv() == [
        "--codec", "fp16", "--bandwidth", "100mbit", "--startup-timeout", "5"]


def readme_example() -> str:
    """The README's Python example: the first ```python block."""
    m = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert m, "README.md has no ```python block"
    return m.group(1)


@pytest.mark.slow
@pytest.mark.dist
def test_readme_api_example_runs_as_written(tmp_path):
    code = readme_example()
    assert "disco.run(" in code and "resnet18" in code
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    err = re.search(r"'max_rel_err_vs_single_process': ([0-9.e+-]+)", res.stdout)
    assert err and float(err.group(1)) < 1e-4, res.stdout[-2000:]
    sent = re.search(r"'bytes_sent_total': (\d+)", res.stdout)
    predicted = re.search(r"'bytes_predicted': (\d+)", res.stdout)
    assert sent and predicted and sent.group(1) == predicted.group(1)
