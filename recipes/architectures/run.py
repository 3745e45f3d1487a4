"""Architectures tried: for each, does it partition, does the split run within 1e-4 of the model, what does
it move; or the exact one-line refusal. Calls the ``disco`` command line only (each command is echoed with
``+``) and writes ``results/architectures.json`` (one entry per model, resumable); ``python -m recipes.pages``
writes docs/architectures.md from it.

    nice -n 10 .venv/bin/python recipes/architectures/run.py            # all models, skipping those done
    nice -n 10 .venv/bin/python recipes/architectures/run.py --engine onnx   # the ONNX engine's column
    .venv/bin/python -m recipes.pages                                    # then the page
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "architectures.json"

# (model name, source); the first six are the "done when" models
MODELS = [
    ("efficientnet_b0", "torchvision"), ("convnext_tiny", "torchvision"), ("shufflenet_v2_x0_5", "torchvision"),
    ("regnet_x_400mf", "torchvision"), ("densenet121", "torchvision"), ("tf_efficientnet_b0", "timm"),
    ("resnet50", "torchvision"), ("mobilenet_v2", "torchvision"), ("googlenet", "torchvision"),
    ("vit_tiny_patch16_224", "timm"), ("efficientnet_b0", "timm"),
    ("mobilenet_v3_large", "torchvision"), ("regnet_y_400mf", "torchvision"), ("mnasnet0_5", "torchvision"),
    ("resnetv2_50x1_bit", "timm"),  # torchvision's swin_t: with the edge hybrids (hybrids.py, issue 43)
    # issue 33: windows, token mixing, GroupNorm, a zero-initialised head, segmentation builders (offline)
    ("swin_tiny_patch4_window7_224", "timm"), ("mixer_b16_224", "timm"), ("poolformer_s12", "timm", "1,3,64,64"),
    ("vit_b_16", "torchvision"), ("lraspp_mobilenet_v3_large", "torchvision", "1,3,128,128"),
    ("fcn_resnet50", "torchvision", "1,3,128,128"),
]
NODES, RATIO, SHAPE = 2, 0.2, "1,3,224,224"  # a model's third entry, where there is one, is its input shape
TOL = 1e-4


def _disco(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "disco.cli", *args]
    print("+ disco " + " ".join(args), flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _last_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {r.returncode}"


def try_model(name: str, source: str, shape: str = SHAPE) -> dict:
    """Cost (dense, r=1) and, when it partitions, export at r=0.2 and run as 2 processes."""
    SHAPE = shape  # noqa: N806  (the model's input shape)
    entry: dict = {"model": name, "source": source, "nodes": NODES, "input_shape": SHAPE, "ratio_target": RATIO}
    t0 = time.time()
    model = f"timm/{name}" if source == "timm" else name  # timm/ picks timm's model where torchvision has the name
    r = _disco("cost", model, "--nodes", str(NODES), "--ratio", "1", "--input-shape", SHAPE, "--json")
    if r.returncode != 0:
        entry.update(partitions=False, refusal=_last_line(r), exit_code=r.returncode)
        return entry
    cost = json.loads(r.stdout)
    entry.update(partitions=True, dense_bytes=cost["dense_bytes"], params=cost["params_dense"])
    with tempfile.TemporaryDirectory(prefix="disco-arch-") as d:
        out = str(Path(d) / "export")
        r = _disco("export", model, "--nodes", str(NODES), "--ratio", str(RATIO), "--input-shape", SHAPE,
                   "--out", out, "--json")
        if r.returncode != 0:
            entry.update(exports=False, refusal=_last_line(r), exit_code=r.returncode)
            return entry
        entry["exports"] = True
        proof = json.loads((Path(out) / "manifest.json").read_text()).get("proof") or {}
        entry["proof"] = ", ".join(proof.get("compared", [])) if proof.get("output_constant") else "output"
        entry["proof_max_rel_err"] = proof.get("max_rel_err")
        r = _disco("run", out, "--nodes", str(NODES), "--json", "--warmup", "0", "--iters", "1",
                   "--timeout", "600", "--startup-timeout", "600")
        if r.stdout.strip():
            rep = json.loads(r.stdout.strip().splitlines()[-1])
            entry.update(ratio=rep["ratio"], max_rel_err=rep["max_rel_err_vs_single_process"],
                         bytes_sent_total=rep["bytes_sent_total"], bytes_predicted=rep["bytes_predicted"],
                         bytes_stats=rep.get("bytes_stats"), latency_ms=rep["latency_ms_median"])
        entry["run_exit_code"] = r.returncode
        if r.returncode != 0:
            entry["run_error"] = _last_line(r)
    entry["seconds"] = round(time.time() - t0, 1)
    constant = entry.get("proof", "output") != "output"  # a constant output: the export proved other tensors
    entry["ok"] = bool(entry.get("run_exit_code") == 0 and (constant or entry.get("max_rel_err") is not None)
                       and (entry.get("max_rel_err") or 0.0) <= TOL
                       and entry["bytes_sent_total"] == entry["bytes_predicted"])
    return entry


def redrawn_weights(model: str, path: Path) -> int:
    """Save ``model``'s random-init weights with every all-zero weight tensor (a zero-initialised head) drawn
    from N(0, 0.02) into ``path``; return how many were redrawn. The ONNX export proves its graphs on the
    model's output, which a zero head makes constant; the split's structure is the same with any weights."""
    import torch

    from disco.models import build_model

    torch.manual_seed(0)
    m = build_model(model)
    zero = [t for n, t in m.named_parameters() if n.endswith("weight") and not t.detach().any()]
    with torch.no_grad():
        for t in zero:
            t.normal_(0.0, 0.02)
    torch.save(m.state_dict(), path)
    return len(zero)


def try_onnx(e: dict) -> dict:
    """The ONNX engine's column (issue 30): a model that splits is exported with ``--format onnx`` (the export
    proves its ONNX graphs against the model's own forward) and run by the torch-free engine. A model whose
    torch export proved inner tensors (a constant output) is exported with its zero weights redrawn
    (:func:`redrawn_weights`); its kept links then follow those weights, so its bytes are checked against its
    own prediction only (``onnx_weights``)."""
    model = f"timm/{e['model']}" if e["source"] == "timm" else e["model"]
    e = {k: v for k, v in e.items() if not k.startswith("onnx_")}  # a retry's fields replace the last try's
    redraw = e.get("proof", "output") != "output"
    with tempfile.TemporaryDirectory(prefix="disco-arch-onnx-") as d:
        out, extra = str(Path(d) / "export"), []
        if redraw:
            n = redrawn_weights(model, Path(d) / "weights.pt")
            e["onnx_weights"] = f"random init, {n} all-zero weight tensor(s) redrawn from N(0, 0.02)"
            extra = ["--weights", str(Path(d) / "weights.pt")]
        r = _disco("export", model, "--nodes", str(NODES), "--ratio", str(RATIO), "--input-shape", e["input_shape"],
                   "--out", out, "--format", "onnx", "--json", *extra)
        if r.returncode != 0:
            return {**e, "onnx_ok": False, "onnx_error": _last_line(r), "onnx_exit_code": r.returncode}
        r = _disco("run", out, "--nodes", str(NODES), "--json", "--warmup", "0", "--iters", "1", "--timeout", "600")
        if r.returncode != 0 or not r.stdout.strip():
            return {**e, "onnx_ok": False, "onnx_error": _last_line(r), "onnx_exit_code": r.returncode}
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    err, want = rep["max_rel_err_vs_single_process"], rep["bytes_predicted"] if redraw else e["bytes_predicted"]
    return {**e, "onnx_max_rel_err": err, "onnx_bytes_sent_total": rep["bytes_sent_total"],
            "onnx_engine": rep.get("engine"), "onnx_ok": rep.get("engine") == "onnxruntime" and (err or 0.0) <= TOL
            and rep["bytes_sent_total"] == rep["bytes_predicted"] == want}


def _key(e: dict) -> str:
    return f"{e['source']}:{e['model']}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="model names to (re)try")
    ap.add_argument("--force", action="store_true", help="retry models already in the JSON")
    ap.add_argument("--engine", choices=("torch", "onnx"), default="torch",
                    help="onnx: add the ONNX engine's column to the models that split (those not done yet)")
    a = ap.parse_args()
    entries = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    if a.engine == "onnx":
        for k, e in enumerate(entries):
            if e.get("ok") and (a.only is None or e["model"] in a.only) and (a.force or "onnx_ok" not in e):
                entries[k] = try_onnx(e)
                print(json.dumps({x: entries[k].get(x) for x in ("model", "onnx_ok", "onnx_max_rel_err",
                                                                   "onnx_error")}), flush=True)
                RESULTS.write_text(json.dumps(entries, indent=1) + "\n")
        return 0
    done = {_key(e) for e in entries}
    for name, source, *shape in MODELS:
        key = f"{source}:{name}"
        if a.only and name not in a.only:
            continue
        if key in done and not a.force and not a.only:
            continue
        e = try_model(name, source, *shape)
        print(json.dumps(e), flush=True)
        entries = [x for x in entries if _key(x) != key] + [e]
        order = {f"{m[1]}:{m[0]}": k for k, m in enumerate(MODELS)}
        entries.sort(key=lambda x: order.get(_key(x), 1 << 20))
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(entries, indent=1) + "\n")
    print("then: python -m recipes.pages (docs/architectures.md from the JSON)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
