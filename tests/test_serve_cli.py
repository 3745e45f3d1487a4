"""``disco serve`` (a supervised local group: a killed node is restarted and rejoins; SIGTERM leaves no process)
and ``disco infer`` (photos, the export's preprocessing, top-5)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.serve_group import ROOT, build, free_port, http, toy_model

ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def _serve(export: Path, port: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "disco.cli", "serve", str(export), "--nodes", "2", "--port",
                             str(port), *extra], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stats(url: str, model: str) -> dict:
    code, _, raw = http(f"{url}/v2/models/{model}/stats")
    return json.loads(raw) if code == 200 else {}


def _wait(cond, limit_s: float = 90.0):  # noqa: ANN001, ANN202
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        try:
            v = cond()
        except OSError:
            v = None
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has ended
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_disco_serve_restarts_a_killed_node_and_stops_cleanly(tmp_path: Path) -> None:
    """SIGKILL rank 1: restarted, it rejoins (rank 0 untouched); SIGKILL rank 0: the group starts again; exact
    after each; SIGTERM to disco serve: exit 0, no process left."""
    d = build(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sup = _serve(d, port)
    try:
        st = _wait(lambda: (s := _stats(url, "toy")).get("ready") and all(n.get("pid") for n in s["nodes"]) and s)
        pids = [n["pid"] for n in st["nodes"]]
        os.kill(pids[1], signal.SIGKILL)
        st = _wait(lambda: (s := _stats(url, "toy")).get("ready") and s["nodes"][1].get("pid") not in (None, pids[1])
                   and s)
        assert st["nodes"][1]["restarts"] == 1 and st["nodes"][0]["pid"] == pids[0]
        x = np.random.default_rng(0).standard_normal([1, 4, 3, 3]).astype(np.float32)
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4, 3, 3], "data": x.ravel().tolist()}]}
        code, _, raw = http(url + "/v2/models/toy/infer", json.dumps(body).encode())
        got = np.asarray(json.loads(raw)["outputs"][0]["data"], np.float32).reshape(x.shape)
        assert code == 200 and np.allclose(got, toy_model(x), rtol=1e-5, atol=1e-6)
        old = [n["pid"] for n in st["nodes"]]
        os.kill(old[0], signal.SIGKILL)  # the leader's end ends the group: it is started again as a whole
        st = _wait(lambda: (s := _stats(url, "toy")).get("ready") and all(
            n.get("pid") not in (None, *old) for n in s["nodes"]) and s)
        code, _, raw = http(url + "/v2/models/toy/infer", json.dumps(body).encode())
        got = np.asarray(json.loads(raw)["outputs"][0]["data"], np.float32).reshape(x.shape)
        assert code == 200 and np.allclose(got, toy_model(x), rtol=1e-5, atol=1e-6)
        pids = old + [n["pid"] for n in st["nodes"]]
    finally:
        sup.send_signal(signal.SIGTERM)
        _, err = sup.communicate(timeout=60)
    assert sup.returncode == 0, err
    assert not [p for p in pids if _alive(p)]


def _classifier(tmp: Path, preprocess: dict | None) -> Path:
    """A random-init cifar_resnet8 ONNX export (3 x 32 x 32, 10 classes); ``preprocess`` added to its manifest."""
    from disco.cli import main

    d = tmp / "cls"
    assert main(["export", "cifar_resnet8", "--nodes", "2", "--ratio", "0.2", "--format", "onnx", "--out",
                 str(d)]) == 0
    if preprocess is not None:
        man = json.loads((d / "manifest.json").read_text())
        man.pop("manifest_hash")
        man["preprocess"] = preprocess
        man["manifest_hash"] = hashlib.sha256(json.dumps(man, sort_keys=True).encode()).hexdigest()[:32]
        (d / "manifest.json").write_text(json.dumps(man))
    return d


@pytest.mark.slow
def test_disco_infer_prints_the_top5_of_the_one_process_model(tmp_path: Path) -> None:
    from PIL import Image

    from disco.edge.client import load_image, preprocessing, top_k
    from disco.edge.simulate import simulate

    labels = [f"thing{i}" for i in range(10)]
    pre = {"size": [32, 32], "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "scale": 255.0, "labels": labels}
    d = _classifier(tmp_path, pre)
    img = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 40, 3), dtype=np.uint8)).save(img)
    port = free_port()
    sup = _serve(d, port)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(lambda: _stats(url, "cls").get("ready"))
        r = subprocess.run([sys.executable, "-m", "disco.cli", "infer", url, str(img)], env=ENV,
                           capture_output=True, text=True, timeout=120)
    finally:
        sup.send_signal(signal.SIGTERM)
        sup.communicate(timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == str(img) and len(lines) == 6
    x = load_image(img, preprocessing({"inputs": [{"shape": [1, 3, 32, 32]}], "parameters": {"preprocess": pre}})[0])
    man = json.loads((d / "manifest.json").read_text())
    (y,) = simulate(d, {man["input"]: x})[0].values()
    want = [f"  {p:7.2%}  {labels[i]}" for i, p in top_k(y)]
    assert lines[1:] == want


@pytest.mark.slow
def test_three_nodes_a_follower_rejoins_and_the_others_reconnect(tmp_path: Path) -> None:
    """N=3: rank 2 killed and started again (rank 1 reconnects to its new address), then rank 1: after each, the
    group answers exactly what the one-process run of the export gives."""
    from disco.cli import main
    from disco.edge.simulate import simulate
    from tests.serve_group import Group

    d = tmp_path / "n3"
    assert main(["export", "cifar_resnet8", "--nodes", "3", "--ratio", "0.3", "--format", "onnx", "--out",
                 str(d)]) == 0
    man = json.loads((d / "manifest.json").read_text())
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(man["input_shape"]).astype(np.float32) for _ in range(3)]
    want = [next(iter(simulate(d, {man["input"]: x})[0].values())) for x in xs]

    def check(g: Group) -> None:
        for x, y in zip(xs, want, strict=True):
            body = {"inputs": [{"name": man["input"], "datatype": "FP32", "shape": list(x.shape),
                                "data": x.ravel().tolist()}]}
            code, _, raw = http(f"{g.url}/v2/models/n3/infer", json.dumps(body).encode())
            assert code == 200, raw
            got = np.asarray(json.loads(raw)["outputs"][0]["data"], np.float32).reshape(y.shape)
            np.testing.assert_allclose(got, y, rtol=1e-4, atol=1e-5 * float(np.abs(y).max()))

    with Group(d, nodes=3, env={"DISCO_RUN_TOKEN": "n3-token"}) as g:
        check(g)
        for r in (2, 1):
            g.procs[r].send_signal(signal.SIGKILL)
            g.procs[r].wait(10)
            g.wait_ready(False)
            g.start(r)
            g.wait_ready(True)
            check(g)
        ended = g.stop()
    assert {r: c for r, (c, _) in ended.items()} == {0: 0, 1: 0, 2: 0}, ended
