"""The start-up self-test (the reference input once, before any input is served), the report's per-node
memory and torch figures, and the node's hook points (empty in production)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from disco.runtime import hooks
from disco_edge import procstat  # the module itself (disco.procstat re-exports it)

ROOT = Path(__file__).resolve().parents[1]


def _export(d: Path) -> Path:
    from disco.graph import partition
    from disco.masks import DiscoModel
    from disco.models import build_model
    from disco.runtime.export import export

    torch.manual_seed(0)
    model = build_model("cifar_resnet8").eval()
    part = partition(model, (1, 3, 32, 32), 2)
    kept = np.random.default_rng(0).random(part.n_links) < 0.3
    export(DiscoModel(model, part, kept).eval(), part, kept, d, {"name": "cifar_resnet8", "kwargs": {}})
    return d


def _rewrite_shard(path: Path, change: dict) -> dict[str, torch.Tensor]:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        header = json.loads(f.metadata()["disco_shard"])
        weights = {k: f.get_tensor(k) for k in f.keys()}
    weights.update(change.pop("weights", {}))
    header.update(change)
    save_file(weights, str(path), metadata={"disco_shard": json.dumps(header)})
    return weights


def edit_weight_consistently(d: Path, rank: int = 1) -> None:
    """Change one weight of ``rank``'s shard and rewrite every checksum (shard header, manifest entry,
    manifest hash, every shard's record of the manifest), so every hash check at load time passes."""
    from safetensors import safe_open

    from disco.checkpoint import state_digest
    from disco.runtime.export import field_digests, manifest_hash

    path = d / f"node{rank}.safetensors"
    with safe_open(str(path), framework="pt") as f:
        name = max((k for k in f.keys() if f.get_tensor(k).dim() == 4), key=lambda k: f.get_tensor(k).numel())
        w = f.get_tensor(name) * 1.5
    digest = state_digest(_rewrite_shard(path, {"weights": {name: w}}))
    man = json.loads((d / "manifest.json").read_text())
    man["shards"][rank]["sha256"] = digest
    fields = field_digests(man)
    man["manifest_hash"] = manifest_hash(fields)
    (d / "manifest.json").write_text(json.dumps(man))
    for j, sh in enumerate(man["shards"]):
        _rewrite_shard(d / sh["file"], {"manifest_fields": fields, "manifest_hash": man["manifest_hash"],
                                        **({"sha256": digest} if j == rank else {})})


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("selftest")
    good = _export(root / "good")
    bad = root / "bad"
    import shutil

    shutil.copytree(good, bad)
    edit_weight_consistently(bad)
    x = root / "x.npy"
    np.save(x, np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32))
    return good, bad, x


def _disco_run(d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "disco.cli", "run", str(d), "--nodes", "2", "--warmup", "0",
                           "--iters", "1", "--timeout", "6", "--startup-timeout", "20", "--json", *args],
                          capture_output=True, text=True, timeout=300)


def test_the_edit_passes_every_hash_check(exports) -> None:
    from disco.runtime.export import load_node

    _, bad, _ = exports
    assert [load_node(bad, j, 2).plan.rank for j in range(2)] == [0, 1]


@pytest.mark.dist
def test_an_intact_export_passes_the_self_test_with_a_user_input(exports) -> None:
    good, _, x = exports
    p = _disco_run(good, "--input", str(x))
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["max_rel_err_vs_single_process"] is None  # a user's input has no reference ...
    assert rep["self_test_max_rel_err"] < 1e-4  # ... but the self-test ran on the shipped one
    assert rep["engine"] == "torch" and rep["torch_in_node"] == [True, True]
    assert len(rep["peak_rss_mb_per_node"]) == 2
    assert all(w / 2**20 < m < 4096 for m, w in zip(rep["peak_rss_mb_per_node"], rep["weight_bytes_per_node"],
                                                     strict=True))


@pytest.mark.dist
def test_a_consistently_edited_export_exits_3_naming_the_rank_with_a_user_input(exports) -> None:
    _, bad, x = exports
    p = _disco_run(bad, "--input", str(x))
    assert p.returncode == 3, (p.returncode, p.stderr)
    line = [ln for ln in p.stderr.splitlines() if ln.strip()][-1]
    assert "self-test failed on rank 0" in line and "--max-rel-err 0.0001" in line, p.stderr
    assert "lost rank" not in line, line  # every node read the leader's verdict before it left
    assert p.stdout == ""  # nothing served


@pytest.mark.dist
def test_node_programs_exit_3_on_a_wrong_answer(exports) -> None:
    """As under torchrun: the node programs themselves fail, not only `disco run`'s final check."""
    from disco.errors import LaunchError
    from disco.runtime.launch import launch

    _, bad, _ = exports
    with pytest.raises(LaunchError, match="self-test failed on rank 0") as ei:
        launch(bad, 2, ["--warmup", "0", "--iters", "1", "--timeout", "6", "--startup-timeout", "20"], timeout=300)
    assert ei.value.codes == [3, 3]


def test_peak_rss_is_this_process_vmhwm_with_a_fallback(monkeypatch) -> None:
    status = Path("/proc/self/status")
    if status.is_file():
        hwm = next(int(ln.split()[1]) for ln in status.read_text().splitlines() if ln.startswith("VmHWM:"))
        assert abs(procstat.peak_rss_mb() - hwm / 1024) < 64  # the same figure, give or take this call's growth
    assert procstat.peak_rss_mb() >= procstat.rss_mb() > 0
    monkeypatch.setattr(procstat, "_status_kb", lambda field: None)
    import resource

    assert procstat.peak_rss_mb() == resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert procstat.torch_loaded()


def test_procstat_needs_no_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None; "
            "import disco.procstat as p; print(p.peak_rss_mb() > 0, p.torch_loaded())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]


def test_hooks_are_empty_unless_installed(monkeypatch, tmp_path) -> None:
    calls: list[tuple[str, int]] = []
    hooks.clear()
    hooks.fire("startup", rank=0)  # nothing installed: nothing happens
    monkeypatch.delenv(hooks.HOOKS_ENV, raising=False)
    hooks.install_from_env()
    assert hooks._HOOKS == {}
    mod = tmp_path / "myhooks.py"
    mod.write_text("def install_node_hooks(register):\n"
                   "    register('inference', lambda rank, k: CALLS.append(('inference', k)))\n"
                   "CALLS = []\n")
    monkeypatch.setenv(hooks.HOOKS_ENV, str(mod))
    try:
        hooks.install_from_env()
        hooks.fire("inference", rank=0, k=3)
        calls = sys.modules["disco_node_hooks"].CALLS
        assert calls == [("inference", 3)]
        with pytest.raises(ValueError, match="unknown hook point"):
            hooks.register("later", lambda **kw: None)
    finally:
        hooks.clear()
    monkeypatch.setenv(hooks.HOOKS_ENV, str(tmp_path / "missing.py"))
    from disco.errors import RefusedError

    with pytest.raises(RefusedError, match="cannot install node hooks"):
        hooks.install_from_env()
