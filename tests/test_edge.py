"""The torch-free node engine (disco_edge) on a hand-built 2-rank ONNX export, torch blocked in the nodes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from edge_export import SHAPE, build

BLOCKED = "import sys; sys.modules['torch'] = None; from disco_edge.node import main; sys.exit(main())"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nodes(d: Path, *extra: str, args: dict[int, list[str]] | None = None, env: dict[str, str] | None = None,
              timeout: float = 60) -> tuple[list[int], list[str], dict | None]:
    """Start both ranks (torch blocked), wait, return (exit codes, stderr texts, rank 0's report)."""
    port, result = _port(), d / "result.json"
    result.unlink(missing_ok=True)
    procs = []
    for r in (0, 1):
        cmd = [sys.executable, "-c", BLOCKED, str(d), "--rank", str(r), "--nodes", "2", "--leader",
               f"127.0.0.1:{port}", "--warmup", "1", "--iters", "3", "--timeout", "5", "--startup-timeout", "10",
               *extra, *(args or {}).get(r, []), *(["--result", str(result)] if r == 0 else [])]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, **(env or {}).get(r, {})} if env else None))
    outs = [p.communicate(timeout=timeout) for p in procs]
    rep = json.loads(result.read_text()) if result.is_file() else None
    return [p.returncode for p in procs], [e for _, e in outs], rep


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("edge") / "toy"
    build(d)
    return d


@pytest.mark.parametrize("codec,payload,overhead", [("fp32", 144, 0), ("fp16", 72, 0), ("int8", 36, 16)])
def test_engine_runs_export_without_torch(export: Path, codec: str, payload: int, overhead: int) -> None:
    codes, errs, rep = run_nodes(export, "--codec", codec, *(["--max-rel-err", "0.05"] if codec != "fp32" else []))
    assert codes == [0, 0], errs
    assert rep["engine"] == "onnxruntime" and rep["torch_in_node"] == [False, False]
    assert rep["bytes_sent_total"] == payload == rep["bytes_predicted"]
    assert rep["bytes_codec_overhead"] == overhead
    assert rep["bytes_input_output"] == 4 * int(np.prod(SHAPE))
    assert rep["messages_per_inference"] == 2
    limit = 1e-6 if codec == "fp32" else 0.05
    assert rep["max_rel_err_vs_single_process"] <= limit
    assert all(m > 0 for m in rep["peak_rss_mb_per_node"]) and len(rep["latency_ms_all"]) == 3


def test_engine_explicit_peers(export: Path) -> None:
    peers = f"127.0.0.1:{_port()},127.0.0.1:{_port()}"
    procs = []
    for r in (0, 1):
        cmd = [sys.executable, "-c", BLOCKED, str(export), "--rank", str(r), "--nodes", "2", "--peers", peers,
               "--iters", "2", "--bandwidth", "100mbit", "--latency", "1ms"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    rep = json.loads(outs[0][0])
    assert rep["latency_ms_median"] >= 2.0  # two messages, 1 ms each, one after the other
    assert rep["bandwidth_mbit"] == 100.0


def test_codecs_match_torch_bytes() -> None:
    torch = pytest.importorskip("torch")
    from disco.runtime.transport import get_codec as torch_codec
    from disco_edge.codecs import get_codec

    x = np.random.default_rng(1).standard_normal([2, 5, 3, 4]).astype(np.float32)
    for name in ("fp32", "fp16", "int8"):
        for axis in (1, 2):
            ours = get_codec(name).encode(x, axis)
            theirs = torch_codec(name).encode(torch.from_numpy(x), axis).numpy()
            assert ours.tobytes() == theirs.tobytes(), (name, axis)
            assert len(ours) == get_codec(name).nbytes(x.shape, axis) == torch_codec(name).nbytes(x.shape, axis)
            back = get_codec(name).decode(ours, x.shape, axis)
            ref = torch_codec(name).decode(torch.from_numpy(theirs.copy()), x.shape, axis).numpy()
            np.testing.assert_array_equal(back, ref)


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert lines and "Traceback" not in err, err
    return lines[0]


def test_bad_inputs_refused(tmp_path: Path, export: Path) -> None:
    other = tmp_path / "swap"
    build(other)
    (other / "rank0" / "schedule.json").write_text((other / "rank1" / "schedule.json").read_text())
    codes, errs, _ = run_nodes(other, "--startup-timeout", "2")
    assert codes[0] == 2 and "rank 1's folder" in _one_line(errs[0])
    bad = tmp_path / "hash"
    build(bad)
    with open(bad / "rank1" / "seg0.onnx", "ab") as f:
        f.write(b"\0")
    codes, errs, _ = run_nodes(bad, "--startup-timeout", "2")
    assert codes[1] == 2 and "sha256 differs" in _one_line(errs[1])
    future = tmp_path / "opset"
    build(future, opset=99)
    codes, errs, _ = run_nodes(future, "--startup-timeout", "2")
    assert codes[1] == 2 and "onnxruntime" in _one_line(errs[1]) and "cannot load it" in _one_line(errs[1])


def test_wrong_token_and_size_and_self_test(tmp_path: Path, export: Path) -> None:
    codes, errs, _ = run_nodes(export, "--startup-timeout", "3",
                               env={0: {"DISCO_RUN_TOKEN": "a"}, 1: {"DISCO_RUN_TOKEN": "b"}})
    assert codes[0] == 2 and "another run token" in _one_line(errs[0])
    assert codes[1] in (2, 3) and "error:" in errs[1]
    short = tmp_path / "short"
    build(short, recv_shape=[1, 3, 3, 3])
    codes, errs, _ = run_nodes(short)
    assert codes[0] == 3 and "has 144 bytes, the schedule says 108" in _one_line(errs[0])
    wrong = tmp_path / "wrong"
    build(wrong, wrong_ref=True)
    codes, errs, _ = run_nodes(wrong)
    assert codes == [3, 3]
    assert "self-test" in _one_line(errs[0]) and "rank 0" in _one_line(errs[1])


def test_stream_keeps_order_and_counts(export: Path) -> None:
    """A stream with 3 inferences started ahead: every message meets its own inference (the output stays
    exact after the stream: the report's error is the self-test's, the final check compares again)."""
    codes, errs, rep = run_nodes(export, "--stream", "3", "--iters", "12")
    assert codes == [0, 0], errs
    assert rep["stream"] == 3 and rep["throughput_per_s"] > 0 and len(rep["latency_ms_all"]) == 12
    assert [len(r) > 0 for r in rep["rss_mb_stream_per_node"]] == [True, True]
    assert rep["bytes_sent_total"] == rep["bytes_predicted"] and rep["messages_per_inference"] == 2
    codes, errs, _ = run_nodes(export, "--stream", "-1")
    assert codes[0] == 2 and "--stream >= 0" in _one_line(errs[0])


def test_input_at_every_node(tmp_path: Path, export: Path) -> None:
    """--input-at every-node: no input message after the self-test, the first served output checked against the
    reference; a rank reading another input than rank 0 fails (exit 3), one of another shape is refused (exit 2)."""
    codes, errs, rep = run_nodes(export, "--input-at", "every-node")
    assert codes == [0, 0], errs
    assert rep["input_at"] == "every-node" and rep["bytes_input_output"] == 0
    assert rep["max_rel_err_vs_single_process"] <= 1e-6 and rep["bytes_sent_total"] == rep["bytes_predicted"]
    other = tmp_path / "other.npy"
    np.save(other, np.ones(SHAPE, dtype=np.float32))
    codes, errs, _ = run_nodes(export, "--input-at", "every-node", args={1: ["--input", str(other)]})
    assert codes[0] == 3 and "rank 1 reads another input than rank 0" in _one_line(errs[0])
    codes, errs, _ = run_nodes(export, "--input-at", "every-node", args={0: ["--input", str(other)]})
    assert codes[0] == 3 and "rank 1 reads another input than rank 0" in _one_line(errs[0])  # rank 1: the reference
    np.save(other, np.ones([1, 4, 3, 2], dtype=np.float32))
    codes, errs, _ = run_nodes(export, "--input-at", "every-node", "--startup-timeout", "2",
                               args={1: ["--input", str(other)]})
    assert codes[1] == 2 and "this rank reads" in _one_line(errs[1])
    codes, errs, _ = run_nodes(export, "--startup-timeout", "2", args={0: ["--input", str(other)]})
    assert codes[0] == 2 and "this rank reads" in _one_line(errs[0])  # rank 0 too, before any compute


def test_disco_run_dispatches_onnx_export(export: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "disco.cli", "run", str(export), "--nodes", "2", "--json",
                          "--iters", "2", "--warmup", "0", "--stream", "2"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["stream"] == 2 and len(rep["rss_mb_stream_per_node"]) == 2
    assert rep["engine"] == "onnxruntime" and rep["torch_in_node"] == [False, False]  # not blocked: never imported
    assert rep["bytes_sent_total"] == rep["bytes_predicted"] and rep["max_rel_err_vs_single_process"] <= 1e-6


def test_engine_imports_no_torch_nor_disco() -> None:
    code = ("import sys, disco_edge.node, disco_edge.engine, disco_edge.transport, disco_edge.bundle; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'disco')]; assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.slow
def test_real_onnx_export_runs_with_torch_blocked(tmp_path: Path) -> None:
    """cifar_resnet8 N=2 r=0.2 exported by `disco export --format onnx`, both nodes with torch blocked: the
    output matches the model's own forward and link bytes equal the cost model's, at fp32 and int8."""
    d = tmp_path / "r8"
    out = subprocess.run([sys.executable, "-m", "disco.cli", "export", "cifar_resnet8", "--nodes", "2", "--ratio",
                          "0.2", "--format", "onnx", "--out", str(d)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    man = json.loads((d / "manifest.json").read_text())
    for codec, scale in (("fp32", 4), ("int8", 1)):
        codes, errs, rep = run_nodes(d, "--codec", codec, "--max-rel-err", "1e-4" if codec == "fp32" else "0.02")
        assert codes == [0, 0], errs
        assert rep["torch_in_node"] == [False, False] and rep["engine"] == "onnxruntime"
        assert rep["bytes_sent_total"] == man["bytes_predicted"] // 4 * scale == rep["bytes_predicted"]
        assert rep["messages_per_inference"] == man["messages_per_inference"]
        assert rep["max_rel_err_vs_single_process"] <= (1e-4 if codec == "fp32" else 0.02)


def test_killed_peer_is_named_fast(export: Path) -> None:
    """A peer killed mid-run: rank 0 names it within seconds (its connection closed), far under --timeout."""
    import signal
    import time

    port = _port()
    procs = [subprocess.Popen([sys.executable, "-c", BLOCKED, str(export), "--rank", str(r), "--nodes", "2",
                               "--leader", f"127.0.0.1:{port}", "--iters", "10000000", "--timeout", "60"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    time.sleep(4)
    assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
    procs[1].send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    _, err = procs[0].communicate(timeout=30)
    procs[1].communicate()
    assert procs[0].returncode == 3 and time.monotonic() - t0 < 10
    assert "lost rank 1" in _one_line(err)


def test_peer_list_and_missing_onnxruntime_refused(export: Path) -> None:
    one = subprocess.run([sys.executable, "-c", BLOCKED, str(export), "--rank", "0", "--nodes", "2", "--peers",
                          f"127.0.0.1:{_port()}"], capture_output=True, text=True, timeout=60)
    assert one.returncode == 2 and "--peers lists 1 addresses for 2 nodes" in _one_line(one.stderr)
    no_ort = BLOCKED.replace("sys.modules['torch'] = None", "sys.modules['onnxruntime'] = None")
    out = subprocess.run([sys.executable, "-c", no_ort, str(export), "--rank", "1", "--nodes", "2", "--leader",
                          f"127.0.0.1:{_port()}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "onnxruntime is not installed" in _one_line(out.stderr)


def test_light_install_pulls_no_torch() -> None:
    """edge/pyproject.toml (the install on each device) ships disco_edge only, needs numpy, onnxruntime and pyzmq
    (ranges admitting the versions installed here) and never torch."""
    from importlib.metadata import version

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    requirement = pytest.importorskip("packaging.requirements").Requirement

    root = Path(__file__).resolve().parents[1]
    proj = tomllib.loads((root / "edge" / "pyproject.toml").read_text())
    reqs = [requirement(r) for r in proj["project"]["dependencies"]]
    assert sorted(r.name for r in reqs) == ["numpy", "onnxruntime", "pyzmq"]
    assert all(r.specifier.contains(version(r.name)) for r in reqs), [(r, version(r.name)) for r in reqs]
    assert proj["tool"]["setuptools"]["packages"] == ["disco_edge"]
    assert (root / "edge" / proj["tool"]["setuptools"]["package-dir"]["disco_edge"] / "__init__.py").is_file()
    main = tomllib.loads((root / "pyproject.toml").read_text())
    assert main["project"]["scripts"]["disco-node"] == proj["project"]["scripts"]["disco-node"]


@pytest.mark.slow
def test_onnx_export_runs_on_two_network_namespaces(tmp_path: Path) -> None:
    """The same ONNX export on two network namespaces joined by a veth pair shaped by tbf at 100 Mbit/s (root
    and iproute2 needed): exact, bytes sent = predicted, torch in neither node."""
    from bench.netns import launch_tc, netns_check

    why = netns_check()
    if why is not None:
        pytest.skip(f"no network namespaces here: {why}")
    d = tmp_path / "r8"
    out = subprocess.run([sys.executable, "-m", "disco.cli", "export", "cifar_resnet8", "--nodes", "2", "--ratio",
                          "0.2", "--format", "onnx", "--out", str(d)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    man = json.loads((d / "manifest.json").read_text())
    rep = launch_tc(d, 100, ["--iters", "3", "--warmup", "1"], timeout=120)
    assert rep["engine"] == "onnxruntime" and rep["torch_in_node"] == [False, False]
    assert rep["bytes_sent_total"] == rep["bytes_predicted"] == man["bytes_predicted"]
    assert rep["max_rel_err_vs_single_process"] <= 1e-4


def test_run_step_feeds_only_the_inputs_a_graph_kept() -> None:
    """torch.onnx.export drops an input whose static shape was all a segment read (lraspp's interpolate to the
    input's size): the engine feeds the graph only the inputs it declares, by name."""
    from types import SimpleNamespace

    from disco_edge.engine import STEPS

    fed = {}

    class Session:
        def run(self, names_out, feeds):  # noqa: ANN001, ANN202
            fed.update(feeds)
            return [feeds["a"] * 2]

    e = SimpleNamespace(io={"g": (["a"], ["y"])}, sessions={"g": Session()})
    env = {"a": np.ones(2, np.float32), "shape_only": np.zeros(3, np.float32)}
    STEPS["run"](e, {"graph": "g", "inputs": ["a", "shape_only"], "outputs": ["y"]}, env)
    assert list(fed) == ["a"] and env["y"].tolist() == [2.0, 2.0]


def test_emulated_downlink_counts_from_arrival_not_from_reading() -> None:
    """A node busy with another request reads its messages late; the emulated downlink must not charge it for
    that (the messages came meanwhile), but two messages that arrive together share the downlink."""
    from disco_edge.link import LinkModel, Pacing

    p = Pacing(LinkModel(bandwidth_bps=8e6))  # 1 MB/s: 1000 bytes take 1 ms
    assert p.arrival(10.0, 1000) == 10.0  # an idle downlink: usable when it arrives
    assert p.arrival(10.5, 1000) == 10.5  # read late or not, the next one is not held behind the first
    assert p.arrival(10.5, 1000) == pytest.approx(10.501)  # two at once: the second waits for the first's 1 ms
    assert Pacing(LinkModel()).arrival(3.0, 10**9) == 3.0  # unshaped: never held
