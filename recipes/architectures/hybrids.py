"""The edge model families of issue 43 (hybrid attention networks): for each model, N=2 and N=3, both engines:
``disco export`` (links by magnitude at r=0.2; the export proves the split against the model's own forward) and
``disco run`` (the split's largest relative error against the single-process model, bytes sent against the cost
model's), or the exact one-line refusal. The dense bytes of the cost model (``disco cost --ratio 1``) stand
beside an independent count made by intercepting every linear and convolution of the model's own forward
(:func:`hooked_dense_bytes`). Calls the ``disco`` command line (each command echoed with ``+``) and writes
``results/architectures_hybrids.json`` (resumable); ``python -m recipes.pages`` fills docs/architectures.md.

    nice -n 10 .venv/bin/python recipes/architectures/hybrids.py              # all models, skipping those done
    nice -n 10 .venv/bin/python recipes/architectures/hybrids.py --only levit_128s --force
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import ROOT, TOL, _disco, _last_line  # noqa: E402  (the same command runner as run.py)

RESULTS = ROOT / "results" / "architectures_hybrids.json"
# (model name, source, input shape): the real input size of each (MobileViT and EdgeNeXt are trained at 256)
MODELS = [
    ("levit_128s", "timm", "1,3,224,224"), ("mobilevit_s", "timm", "1,3,256,256"),
    ("efficientformer_l1", "timm", "1,3,224,224"), ("edgenext_small", "timm", "1,3,256,256"),
    ("coat_lite_tiny", "timm", "1,3,224,224"), ("maxvit_t", "torchvision", "1,3,224,224"),
    ("swin_t", "torchvision", "1,3,224,224"),
]
NODES, RATIO, ENGINES = (2, 3), 0.2, ("torch", "onnx")


def hooked_dense_bytes(model_name: str, shape: tuple[int, ...], nodes: int) -> dict:
    """Dense within-layer parallelism's bytes per image counted from the model's own forward, without our graph:
    every ``F.linear`` / ``F.conv2d`` whose weight is a parameter is intercepted (a torch function mode, so the
    functional calls of torchvision's Swin count too), each distinct input tensor counted once (q, k and v read
    one), its values times (N - 1) times 4 bytes: each channel is owned by one node and read by the N - 1 others.
    Left out: a depthwise convolution (channel-local), and inputs that every node holds (the same for two input
    images: the image itself read through channel-local ops only is counted by ``image_path`` below, and
    constants such as position encodings)."""
    import torch
    from torch.overrides import TorchFunctionMode

    from disco.models import build_model

    torch.manual_seed(0)
    model = build_model(model_name).eval()
    params = {id(p) for p in model.parameters()}

    class Count(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[torch.Tensor, str]] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            kwargs = kwargs or {}
            w = args[1] if len(args) > 1 else kwargs.get("weight")
            if func in (torch.nn.functional.linear, torch.nn.functional.conv2d) and id(w) in params:
                x = args[0]
                groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
                depthwise = func is torch.nn.functional.conv2d and groups > 1 and groups == x.shape[1]
                if not depthwise:
                    self.seen.append((x, "linear" if func is torch.nn.functional.linear else "conv"))
            return func(*args, **kwargs)

    runs = []
    for seed in (1, 2):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        mode = Count()
        with torch.no_grad(), mode:
            model(x)
        runs.append((x, mode.seen))
    (x1, a), (_, b) = runs
    total, distinct, constant = 0, set(), 0
    for (t, _), (u, _) in zip(a, b, strict=True):
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if key in distinct:
            continue
        distinct.add(key)
        if t.data_ptr() == x1.data_ptr() or torch.equal(t, u):  # the input image, or a constant
            constant += 1
            continue
        total += t.numel() * (nodes - 1) * 4
    return {"hooked_dense_bytes": total, "hooked_inputs": len(distinct), "hooked_replicated_inputs": constant}


def try_split(model: str, shape: str, nodes: int, engine: str, d: str) -> dict:
    """Export at r=0.2 for ``nodes`` with ``engine``'s format, run it; the report's figures or the refusal."""
    out = str(Path(d) / f"export_{engine}_{nodes}")
    fmt = ["--format", "onnx"] if engine == "onnx" else []
    r = _disco("export", model, "--nodes", str(nodes), "--ratio", str(RATIO), "--input-shape", shape, "--out", out,
               "--json", *fmt)
    if r.returncode != 0:
        return {"ok": False, "error": _last_line(r), "exit_code": r.returncode}
    man = json.loads((Path(out) / "manifest.json").read_text())
    proof = man.get("proof") or {}
    r = _disco("run", out, "--nodes", str(nodes), "--json", "--warmup", "0", "--iters", "1", "--timeout", "900",
               "--startup-timeout", "900")
    if r.returncode != 0 or not r.stdout.strip():
        return {"ok": False, "error": _last_line(r), "exit_code": r.returncode}
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    err = rep["max_rel_err_vs_single_process"]
    e = {"engine_ran": rep.get("engine"), "ratio": rep["ratio"], "max_rel_err": err,
         "bytes_sent_total": rep["bytes_sent_total"], "bytes_predicted": rep["bytes_predicted"],
         "proof": proof.get("compared"), "proof_depth": proof.get("depth"), "proof_max_rel_err": proof.get(
             "max_rel_err")}
    e["ok"] = bool(err is not None and err <= TOL and e["bytes_sent_total"] == e["bytes_predicted"]
                   and (engine == "torch" or e["engine_ran"] == "onnxruntime"))
    return e


def try_model(name: str, source: str, shape: str) -> dict:
    model = f"timm/{name}" if source == "timm" else name
    entry: dict = {"model": name, "source": source, "input_shape": shape, "ratio_target": RATIO, "splits": {}}
    t0 = time.time()
    for n in NODES:
        r = _disco("cost", model, "--nodes", str(n), "--ratio", "1", "--input-shape", shape, "--json")
        if r.returncode != 0:
            entry.update(partitions=False, refusal=_last_line(r), exit_code=r.returncode)
            return entry
        cost = json.loads(r.stdout)
        entry["partitions"] = True
        entry[f"dense_bytes_{n}"] = cost["dense_bytes"]
        entry.update({f"{k}_{n}": v for k, v in hooked_dense_bytes(model, tuple(
            int(v) for v in shape.split(",")), n).items()})
        with tempfile.TemporaryDirectory(prefix="disco-hybrid-") as d:
            for engine in ENGINES:
                entry["splits"][f"{engine}/{n}"] = try_split(model, shape, n, engine, d)
    entry["ok"] = all(s.get("ok") for s in entry["splits"].values()) and len(entry["splits"]) == 4
    entry["seconds"] = round(time.time() - t0, 1)
    return entry


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="model names to (re)try")
    ap.add_argument("--force", action="store_true", help="retry models already in the JSON")
    a = ap.parse_args()
    entries = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    done = {e["model"] for e in entries}
    order = {m[0]: k for k, m in enumerate(MODELS)}
    for name, source, shape in MODELS:
        if (a.only and name not in a.only) or (name in done and not a.force and not a.only):
            continue
        e = try_model(name, source, shape)
        print(json.dumps(e), flush=True)
        entries = sorted([x for x in entries if x["model"] != name] + [e], key=lambda x: order.get(x["model"], 99))
        RESULTS.write_text(json.dumps(entries, indent=1) + "\n")
    print("then: python -m recipes.pages (docs/architectures.md from the JSON)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
