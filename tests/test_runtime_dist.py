"""The runtime as real processes over torch.distributed (gloo on 127.0.0.1): invariants and failures."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from disco.cost import estimate
from disco.graph import partition
from disco.masks import DiscoModel
from disco.models import build_model
from disco.runtime.export import export
from disco.runtime.launch import LaunchError, free_port, launch, node_command

pytestmark = pytest.mark.dist

FAST = ["--warmup", "0", "--iters", "1", "--timeout", "4", "--startup-timeout", "6"]


def _export(d: Path, name: str, n: int, seed: int = 0, frac: float = 0.3) -> dict:
    torch.manual_seed(seed)
    model = build_model(name)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2)
    part = partition(model, (1, 3, 32, 32), n)
    kept = np.random.default_rng(seed + n).random(part.n_links) < frac
    dm = DiscoModel(model, part, kept)
    man = export(dm, part, kept, d, {"name": name, "kwargs": {}})
    man["_estimate"] = estimate(part, kept)
    return man


@pytest.mark.parametrize("name", ["cifar_resnet8", "cifar_resnet20"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_processes_match_single_process_and_cost_model(tmp_path, name: str, n: int) -> None:
    man = _export(tmp_path, name, n)
    rep = launch(tmp_path, n, FAST, timeout=60)
    assert rep["max_rel_err_vs_single_process"] < 1e-4  # invariant 2
    assert rep["bytes_sent_total"] == rep["bytes_predicted"] == man["_estimate"].bytes  # invariant 3
    assert rep["params_per_node"] == man["_estimate"].params_per_node  # invariant 4
    # each node loaded exactly its shard file's tensors (fp32 parameters and the buffers of its channels) ...
    from safetensors.torch import load_file

    shard = [sum(t.numel() * t.element_size() for t in load_file(str(tmp_path / f"node{j}.safetensors")).values())
             for j in range(n)]
    assert rep["weight_bytes_per_node"] == shard
    assert all(b >= 4 * p for b, p in zip(shard, man["_estimate"].params_per_node, strict=True))
    # ... and its peak memory holds at least those weights
    assert all(rss * 2**20 > w for rss, w in zip(rep["peak_rss_mb_per_node"], rep["weight_bytes_per_node"],
                                                 strict=True))


def test_lossy_codec_and_pacing_and_streaming(tmp_path) -> None:
    _export(tmp_path, "cifar_resnet8", 2)
    rep = launch(tmp_path, 2, ["--codec", "fp16", "--bandwidth", "100mbit", "--latency", "1ms", "--warmup", "1",
                               "--iters", "3", "--stream", "2", "--timeout", "5"], timeout=60)
    assert 0 < rep["max_rel_err_vs_single_process"] < 5e-3
    assert rep["bytes_sent_total"] == rep["bytes_predicted"]
    assert rep["shaping"] == "pacing" and rep["bandwidth_mbit"] == 100
    assert rep["throughput_per_s"] > 0


def test_input_at_every_node_sends_no_input_and_stays_exact(tmp_path) -> None:
    """--input-at every-node: the non-leader reads the input itself; the timed output (the report's error is the
    first timed inference's) is still the single-process model's, and no input crosses the link."""
    _export(tmp_path, "cifar_resnet8", 2)
    lead = launch(tmp_path, 2, FAST, timeout=60)
    every = launch(tmp_path, 2, [*FAST, "--input-at", "every-node"], timeout=60)
    assert every["input_at"] == "every-node" and every["max_rel_err_vs_single_process"] < 1e-4
    assert lead["bytes_input_output"] - every["bytes_input_output"] == 4 * 3 * 32 * 32
    assert every["bytes_sent_total"] == lead["bytes_sent_total"] == every["bytes_predicted"]


def _alive(pids: list[int]) -> list[int]:
    out = []
    for p in pids:
        try:
            os.kill(p, 0)
            out.append(p)
        except ProcessLookupError:
            pass
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_peer_killed_mid_run_ends_the_others(tmp_path, n: int, monkeypatch) -> None:
    _export(tmp_path, "cifar_resnet8", n)
    # the fault hook of bench/faults.py: rank 1 sends itself SIGKILL before its 4th inference
    monkeypatch.setenv("DISCO_NODE_HOOKS", str(Path(__file__).resolve().parents[1] / "bench" / "faults.py"))
    monkeypatch.setenv("DISCO_FAULT", '{"rank": 1, "at": "run", "after": 3, "signal": "KILL"}')
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as ei:
        launch(tmp_path, n, ["--warmup", "0", "--iters", "100000", "--timeout", "3"], timeout=60, grace=15)
    dt = time.monotonic() - t0
    codes = ei.value.codes
    assert codes[1] == -9  # the killed one
    assert all(c not in (0, None) for c in codes)  # every other exits non-zero by itself (not killed by us)
    assert all(c == 3 for k, c in enumerate(codes) if k != 1), codes
    for k, err in enumerate(ei.value.stderr):
        if k != 1:
            assert "lost rank 1" in err, err
    assert dt < 30


def test_shard_of_other_export_refused_before_compute(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _export(a, "cifar_resnet8", 2, seed=0)
    _export(b, "cifar_resnet8", 2, seed=1)
    shutil.copy(b / "node1.safetensors", a / "node1.safetensors")
    with pytest.raises(LaunchError, match="rank 1 refused to start: shard .* is from another model") as ei:
        launch(a, 2, FAST, timeout=60)
    assert ei.value.codes == [2, 2]


def test_edited_manifest_refused_before_compute(tmp_path) -> None:
    import json

    from disco.checkpoint import pack_bits, unpack_bits

    _export(tmp_path, "cifar_resnet8", 2)
    man = json.loads((tmp_path / "manifest.json").read_text())
    kept = unpack_bits(man["kept"], man["n_links"])
    on, off = np.flatnonzero(kept)[0], np.flatnonzero(~kept)[0]
    kept[on], kept[off] = False, True  # one kept link moved
    man["kept"] = pack_bits(kept)
    (tmp_path / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(LaunchError, match=r"ranks 0, 1 refused to start: .*manifest.json: field 'kept'") as ei:
        launch(tmp_path, 2, FAST, timeout=60)
    assert ei.value.codes == [2, 2] and ei.value.exit_code == 2
    assert str(ei.value).count("refused to start") == 1  # each reason once


def test_wrong_input_refused_at_leader(tmp_path) -> None:
    _export(tmp_path, "cifar_resnet8", 2)
    bad = tmp_path / "in.pt"
    torch.save(torch.zeros(1, 3, 28, 28), bad)
    with pytest.raises(LaunchError, match=r"input has shape \(1, 3, 28, 28\)"):
        launch(tmp_path, 2, FAST + ["--input", str(bad)], timeout=60)
    torch.save(torch.zeros(1, 3, 32, 32, dtype=torch.float64), bad)
    with pytest.raises(LaunchError, match="dtype torch.float64"):
        launch(tmp_path, 2, FAST + ["--input", str(bad)], timeout=60)


def test_missing_peer_at_startup(tmp_path) -> None:
    _export(tmp_path, "cifar_resnet8", 2)
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="joined/1 not there"):
        launch(tmp_path, 2, FAST[:-1] + ["3"], ranks=[0], timeout=120)
    assert time.monotonic() - t0 < 60  # start-up timeout 3 s + imports on a loaded machine; not the launch timeout


def test_port_in_use(tmp_path) -> None:
    _export(tmp_path, "cifar_resnet8", 2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(LaunchError, match="in use|cannot") as ei:
            launch(tmp_path, 2, FAST[:-1] + ["3"], port=port, timeout=120)
        assert time.monotonic() - t0 < 60  # not the launch timeout: node 0 refuses, node 1 is ended
    assert ei.value.codes[0] == 3


def test_torchrun_env_rendezvous(tmp_path) -> None:
    """The same node program under torchrun (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE from the environment)."""
    _export(tmp_path, "cifar_resnet8", 2)
    res = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "disco.runtime.node", str(tmp_path), *FAST, "--result", str(res)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-2000:]
    import json

    rep = json.loads(res.read_text())
    assert rep["nodes"] == 2 and rep["max_rel_err_vs_single_process"] < 1e-4
    assert rep["bytes_sent_total"] == rep["bytes_predicted"]


def test_node_commands_run_as_plain_processes(tmp_path) -> None:
    """The command lines ``launch`` starts work by themselves: two plain Python processes, no launcher."""
    import json

    _export(tmp_path, "cifar_resnet8", 2)
    port, res = free_port(), tmp_path / "r.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(node_command(tmp_path, r, 2, port, FAST, res if r == 0 else None),
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        codes = [p.wait(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0], [p.stderr.read()[-1000:] for p in procs]
    rep = json.loads(res.read_text())
    assert rep["nodes"] == 2 and rep["max_rel_err_vs_single_process"] < 1e-4
