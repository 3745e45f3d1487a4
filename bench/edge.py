"""The device engine side by side (issue 30 item 7): per model, the dense model in one torch and one ONNX Runtime
process, then each split setting on the torch and the ONNX engine, unshaped and at each emulated bandwidth: peak
RSS of every process, weights per node, latency, messages, bytes; one thread each. Writes results/edge.json (an
entry per measurement, written as each ends; a rerun skips what is there).

    python -m bench.edge                                  # resnet50 (224) and cifar_resnet20, every setting
    python -m bench.edge --models cifar_resnet20 --bandwidths none,100mbit --iters 5   # a quick look
    python -m bench.edge --models tf_efficientnet_lite0 --checkpoint runs/pretrained/n2_r0.2_s0/finetuned.safetensors \
        --bandwidths none,100mbit                         # a trained DISCO checkpoint's own split (issue 42)
    OMP_NUM_THREADS=1 python -m bench.edge --pingpong     # the transports' ping-pong -> results/pingpong.json (20 s)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"resnet50": (1, 3, 224, 224), "cifar_resnet20": (1, 3, 32, 32), "tf_efficientnet_lite0": (1, 3, 224, 224)}
SETTINGS = [  # (N, target ratio, budget): issue 30's three splits, and the dense split they are compared with
    (2, 0.2, "global"), (2, 0.2, "joint"), (4, 0.1, "global"), (2, 1.0, "global")]
BANDWIDTHS = ("none", "1gbit", "100mbit", "10mbit")
ENGINES = ("torch", "onnx")
log = logging.getLogger("bench.edge")

# one process running the dense model (torch eager, or ONNX Runtime without torch) then TIMED, its JSON line
TIMED = """
ts = []
for k in range(iters + 2):
    t0 = time.perf_counter(); run(); ts.append(time.perf_counter() - t0)
ts = sorted(ts[2:])
print(json.dumps({"latency_ms_median": ts[len(ts) // 2] * 1e3, "peak_rss_mb": peak_rss_mb(),
                  "torch_in_process": torch_loaded()}))
"""
SINGLE_TORCH = """
import json, sys, time
import torch
from disco.models import build_model
from disco.procstat import peak_rss_mb, torch_loaded
torch.set_num_threads(1); torch.manual_seed(0)
shape, iters = json.loads(sys.argv[1]), int(sys.argv[3])
model = build_model(sys.argv[2]).eval(); x = torch.randn(shape)
torch.set_grad_enabled(False)
run = lambda: model(x)
""" + TIMED
SINGLE_ORT = """
import json, sys, time
sys.modules["torch"] = None  # this process must never import torch
import numpy as np
import onnxruntime as ort
from disco_edge.engine import session
from disco_edge.procstat import peak_rss_mb, torch_loaded
opt = ort.SessionOptions(); opt.intra_op_num_threads = 1; opt.inter_op_num_threads = 1
sess = (session(sys.argv[1], "basic") if sys.argv[3] == "basic"  # the nodes' settings at the leanest level,
        else ort.InferenceSession(sys.argv[1], opt, providers=["CPUExecutionProvider"]))  # or ORT's defaults
inp = sess.get_inputs()[0]
x = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)
iters, run = int(sys.argv[2]), lambda: sess.run(None, {inp.name: x})
""" + TIMED


def _json_run(cmd: list[str], timeout: float) -> dict[str, Any]:
    """A command whose stdout's last line is JSON; a failure becomes an entry with its error."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1][:300]}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def single_torch(model: str, shape: tuple[int, ...], iters: int) -> dict[str, Any]:
    return _json_run([sys.executable, "-c", SINGLE_TORCH, json.dumps(list(shape)), model, str(iters)], 3600)


def single_ort(model: str, shape: tuple[int, ...], iters: int, work: Path, sessions: str) -> dict[str, Any]:
    """The dense model in ONNX, run in a process without torch, its session as the engine's nodes make theirs
    (``sessions="basic"``: the leanest) or with ONNX Runtime's defaults (``"default"``: the fastest)."""
    import torch

    from disco.models import build_model

    path = work / f"{model}_dense.onnx"
    if not path.is_file():
        torch.manual_seed(0)
        torch.onnx.export(build_model(model).eval(), (torch.randn(shape),), str(path), dynamo=False,
                          input_names=["x"], output_names=["y"])
    return _json_run([sys.executable, "-c", SINGLE_ORT, str(path), str(iters), sessions], 3600)


def export(model: str, shape: tuple[int, ...], setting: tuple, engine: str, work: Path,
           checkpoint: str | None = None) -> Path:
    """The split of ``model`` by name (random weights, magnitude links), or the DISCO ``checkpoint``'s own."""
    n, r, budget = setting
    out = work / f"{model}_n{n}_r{r:g}_{budget}_{engine}{'_ckpt' if checkpoint else ''}"
    if not (out / "manifest.json").is_file():
        cmd = [sys.executable, "-m", "disco.cli", "export", model, "--nodes", str(n), "--ratio", str(r),
               "--budget", budget, "--input-shape", ",".join(map(str, shape)), "--out", str(out), "--json"]
        if checkpoint:
            cmd = [sys.executable, "-m", "disco.cli", "export", checkpoint, "--out", str(out), "--json"]
        if engine == "onnx":
            cmd += ["--format", "onnx"]
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return out


def split_run(folder: Path, n: int, bandwidth: str, iters: int, codec: str, input_at: str = "leader"
              ) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "disco.cli", "run", str(folder), "--nodes", str(n), "--iters", str(iters),
           "--warmup", "2", "--codec", codec, "--input-at", input_at, "--json"]
    if bandwidth != "none":
        cmd += ["--bandwidth", bandwidth]
    rep = _json_run(cmd, 3600)
    keep = ("latency_ms_median", "peak_rss_mb_per_node", "torch_in_node", "weight_bytes_per_node",
            "params_per_node", "params_dense", "bytes_sent_total", "bytes_predicted", "messages_per_inference",
            "max_rel_err_vs_single_process", "ratio", "error")
    return {**{k: rep[k] for k in keep if k in rep}, "node_engine": rep.get("engine")}  # what the report says ran


def pingpong(iters: int = 300) -> dict[str, Any]:
    """One-way ping-pong on loopback (median round trip / 2, two processes) of each engine's own transport, for
    1 KB and 1 MB: ZeroMQ (``disco_edge.pingpong``) and gloo (``DistTransport``, as the latency sweep calibrates)."""
    from disco.runtime.latency import calibrate_delay
    from disco_edge.pingpong import measure as zmq

    rows = []
    for kind in ("zmq", "gloo"):
        for size in (1024, 1 << 20):
            n = iters if size <= 65536 else max(10, iters // 6)
            t = (zmq([size], n, 30)[0]["one_way_s"] if kind == "zmq"
                 else calibrate_delay([size], reps=n)[1]["one_way_s"][0])
            rows.append({"transport": kind, "bytes": size, "one_way_ms": t * 1e3, "iters": n})
    return {"what": "one-way ping-pong on loopback (median round trip / 2), two processes",
            "host_cpus": len(os.sched_getaffinity(0)), "rows": rows}


EVERY_NODE = [  # (N, ratio, budget, bandwidth, codec): the speed targets' splits again, each node reading the input
    (2, 0.2, "global", "1gbit", "fp16"), (2, 0.2, "global", "100mbit", "fp32"), (2, 1.0, "global", "100mbit", "fp32")]


def plan(models: list[str], bandwidths: list[str], codec: str, checkpoint: dict[str, Any] | None = None
         ) -> list[dict[str, Any]]:
    """Every measurement of the run, in order: the dense processes of a model, then its splits (on the wire:
    ``codec``; fp32 also runs the fp16 setting of issue 30's speed target, N=2 r=0.2 at 1 Gbit/s), then the speed
    targets' splits with the input read by every node (``--input-at every-node``: no input message). With
    ``checkpoint`` (its path, nodes, ratio, budget), the one split of that DISCO checkpoint on each engine."""
    out: list[dict[str, Any]] = []
    if checkpoint:
        (m,) = models
        c = checkpoint
        out += [{"model": m, "what": "single", "engine": "torch"}]
        out += [{"model": m, "what": "single", "engine": "onnx", "sessions": s} for s in ("basic", "default")]
        return out + [{"model": m, "what": "split", "engine": e, "nodes": c["nodes"], "target_ratio": c["ratio"],
                       "budget": c["budget"], "bandwidth": bw, "codec": codec, "checkpoint": c["path"]}
                      for e in ENGINES for bw in bandwidths]
    for m in models:
        out += [{"model": m, "what": "single", "engine": "torch"}]
        out += [{"model": m, "what": "single", "engine": "onnx", "sessions": s} for s in ("basic", "default")]
        out += [{"model": m, "what": "split", "engine": e, "nodes": n, "target_ratio": r, "budget": b,
                 "bandwidth": bw, "codec": c} for (n, r, b) in SETTINGS for e in ENGINES for bw in bandwidths
                for c in (codec, "fp16") if c == codec or (codec, n, r, b, bw) == ("fp32", 2, 0.2, "global", "1gbit")]
        out += [{"model": m, "what": "split", "engine": e, "nodes": n, "target_ratio": r, "budget": b, "bandwidth": bw,
                 "codec": c, "input_at": "every-node"} for (n, r, b, bw, c) in EVERY_NODE for e in ENGINES
                if bw in bandwidths]
    return out


def key(e: dict[str, Any]) -> tuple:
    return tuple(e.get(k) for k in ("model", "what", "engine", "sessions", "nodes", "target_ratio", "budget",
                                    "bandwidth", "codec", "input_at", "checkpoint"))


def measure(item: dict[str, Any], work: Path, iters: int) -> dict[str, Any]:
    shape = MODELS[item["model"]]
    if item["what"] == "single":
        res = (single_torch(item["model"], shape, iters) if item["engine"] == "torch"
               else single_ort(item["model"], shape, iters, work, item["sessions"]))
        return {**item, **res}
    setting = (item["nodes"], item["target_ratio"], item["budget"])
    try:
        folder = export(item["model"], shape, setting, item["engine"], work, item.get("checkpoint"))
    except subprocess.CalledProcessError as e:
        return {**item, "error": f"export: {(e.stderr or b'').decode().strip().splitlines()[-1:]}"}
    return {**item, **split_run(folder, item["nodes"], item["bandwidth"], iters, item["codec"],
                                item.get("input_at", "leader"))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--bandwidths", default=",".join(BANDWIDTHS), help="'none' is unshaped")
    p.add_argument("--iters", type=int, default=10, help="timed inferences per measurement (default: 10)")
    p.add_argument("--codec", default="fp32", choices=("fp32", "fp16", "int8"), help="on the wire (default: fp32)")
    p.add_argument("--out", default=str(ROOT / "results" / "edge.json"))
    p.add_argument("--work", help="folder for the exports (default: a temporary one)")
    p.add_argument("--pingpong", action="store_true", help="only the transports' ping-pong (results/pingpong.json)")
    p.add_argument("--checkpoint", help="a DISCO checkpoint of the one model of --models: its own split is measured")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.pingpong:
        (ROOT / "results" / "pingpong.json").write_text(json.dumps(res := pingpong(), indent=1) + "\n")
        log.info("%s", json.dumps(res["rows"]))
        return
    models = [m for m in a.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    out = Path(a.out)
    done = json.loads(out.read_text()) if out.is_file() else []
    have = {key(e) for e in done if "error" not in e}
    ckpt = None
    if a.checkpoint:
        from disco.checkpoint import read_metadata

        meta = read_metadata(a.checkpoint)
        if len(models) != 1 or meta["model"]["name"] != models[0] or not meta.get("disco"):
            p.error(f"--checkpoint {a.checkpoint} is a {'DISCO' if meta.get('disco') else 'dense'} checkpoint of "
                    f"{meta['model']['name']}: give it with --models {meta['model']['name']} alone")
        ckpt = {"path": a.checkpoint, "nodes": meta["disco"]["nodes"], "ratio": round(meta["disco"]["ratio"], 4),
                "budget": meta["disco"].get("budget", "global")}
    todo = [i for i in plan(models, a.bandwidths.split(","), a.codec, ckpt) if key(i) not in have]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for k, item in enumerate(todo, 1):
            res = measure(item, work, a.iters)
            log.info("[%d/%d] %s", k, len(todo), json.dumps({x: res.get(x) for x in (*item, "latency_ms_median",
                                                                                      "error")}))
            done = [e for e in done if key(e) != key(res)] + [res]
            out.write_text(json.dumps(done, indent=1) + "\n")


if __name__ == "__main__":
    main()
