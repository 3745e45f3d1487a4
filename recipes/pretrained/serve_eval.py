"""End to end: a DISCO checkpoint of the pretrained network exported for devices, served by its nodes, and both
evaluation sets classified through the service with tritonclient: the same top-1 as the torch evaluation.

    python recipes/pretrained/serve_eval.py runs/pretrained/n2_r0.2_s0/finetuned.safetensors

It exports the checkpoint (``disco export --format onnx``: proved against the model's own forward), starts
``disco serve EXPORT --nodes N`` on a free port of 127.0.0.1, sends every photo of both sets with tritonclient
(binary tensors, preprocessed with the manifest's own ``preprocess``), compares each answer's top-1 with the
torch model's on the same photo, stops the service (SIGTERM) and writes results/imagenette_pretrained_served.json.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--work", default=str(ROOT / "runs" / "pretrained" / "served"))
    p.add_argument("--limit", type=int, default=None, help="photos per set (default: all)")
    p.add_argument("--out", default=str(ROOT / "results" / "imagenette_pretrained_served.json"))
    a = p.parse_args()

    import torch
    import tritonclient.http as http

    from disco.data.imagenet import EVAL_SETS, load_eval, normalize
    from disco.loading import load
    from disco.tasks.imagenet import predict

    torch.set_num_threads(1)
    export = Path(a.work) / "export"
    if not (export / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "disco.cli", "export", a.checkpoint, "--format", "onnx", "--out",
                        str(export)], check=True, cwd=ROOT)
    man = json.loads((export / "manifest.json").read_text())
    pre, nodes = man["preprocess"], int(man["nodes"])
    loaded = load(a.checkpoint)
    port = _free_port()
    srv = subprocess.Popen([sys.executable, "-m", "disco.cli", "serve", str(export), "--nodes", str(nodes),
                            "--port", str(port)], cwd=ROOT)
    out: dict = {"checkpoint": a.checkpoint, "nodes": nodes, "ratio": man["ratio"], "sets": {}}
    try:
        client = http.InferenceServerClient(f"127.0.0.1:{port}")
        t0 = time.monotonic()
        while not _ready(client):
            if srv.poll() is not None or time.monotonic() - t0 > 300:
                raise SystemExit(f"the service did not become ready (exit {srv.poll()})")
            time.sleep(0.5)
        meta = client.get_model_metadata(export.name)
        in_name, out_name = meta["inputs"][0]["name"], meta["outputs"][0]["name"]
        for name in EVAL_SETS:
            photos = load_eval(a.data, name)
            if a.limit:
                photos = photos.subset(range(min(a.limit, len(photos))))
            plain = loaded.model.eval()
            torch_top1 = predict(plain, photos, pre)[:, 0]
            served, t = [], time.perf_counter()
            for i in range(len(photos)):
                x = normalize(photos.images[i:i + 1], pre["mean"], pre["std"]).numpy().astype(np.float32)
                inp = http.InferInput(in_name, list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=True)
                res = client.infer(export.name, [inp], outputs=[http.InferRequestedOutput(out_name, binary_data=True)])
                served.append(int(res.as_numpy(out_name).argmax()))
            s = torch.tensor(served)
            y = photos.labels
            out["sets"][name] = {"photos": len(photos), "top1_served": round(100.0 * float((s == y).float().mean()), 2),
                                 "top1_torch": round(100.0 * float((torch_top1 == y).float().mean()), 2),
                                 "same_top1": int((s == torch_top1).sum()),
                                 "seconds_per_request": round((time.perf_counter() - t) / len(photos), 4)}
            print(name, out["sets"][name], flush=True)
    finally:
        srv.send_signal(signal.SIGTERM)
        out["serve_exit"] = srv.wait(timeout=60)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


def _ready(client: object) -> bool:
    try:
        return bool(client.is_server_ready())  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001  (connection refused while the group starts)
        return False


if __name__ == "__main__":
    main()
