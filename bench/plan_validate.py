"""Validate ``disco plan`` on settings its calibration did not see: run each recommendation for real.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.plan_validate          # results/planner_validation.json
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.plan_validate 3,4      # only these settings (indices)
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.plan_validate --host-check   # the host's slowdown now

Per setting: ``disco plan ... --cores 2 --json`` (and with ``--time-host``: CPU costs scaled to this host),
then ``disco export`` and ``disco run`` of its recommendation on the setting's link; measured against both
predictions, with the load average around each run (the host is shared). The calibration saw six models at N=2
and 4, equal shares, 10/100/1000 Mbit/s and unshaped, no added latency: every setting differs (N=3, added
latency, unequal shares, other models); the last six price and run the ONNX engine (timed here at plan time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "planner_validation.json"
DISCO = [sys.executable, "-m", "disco.cli"]
PLAN = ("nodes", "ratio_target", "codec", "shares")  # what identifies a candidate of a plan
SETTINGS = [
    {"model": "cifar_resnet20", "input_shape": "1,3,32,32", "bandwidth": "50mbit", "latency": "20ms", "nodes": "3"},
    {"model": "resnet18", "input_shape": "1,3,64,64", "bandwidth": "100mbit", "latency": "2ms", "nodes": "2,3"},
    {"model": "resnet18", "input_shape": "1,3,64,64", "bandwidth": "1gbit", "latency": "5ms", "nodes": "3",
     "shares": "2,1,1"},
    {"model": "cifar_resnet20", "input_shape": "1,3,32,32", "bandwidth": "200mbit", "latency": "1ms", "nodes": "2",
     "shares": "2,1"},
    {"model": "mobilenet_v3_small", "input_shape": "1,3,96,96", "bandwidth": "100mbit", "latency": "2ms",
     "nodes": "2,3"},
    {"model": "resnet50", "input_shape": "1,3,224,224", "bandwidth": "100mbit", "latency": "2ms", "nodes": "2,4"},
] + [{"model": "cifar_resnet20", "input_shape": "1,3,32,32", "bandwidth": b, "latency": "0ms", "nodes": "2",
      "ratios": r, "codecs": "fp32", "engine": "onnx"} for r in ("0.2", "1") for b in ("none", "100mbit")] + [
    {"model": "resnet50", "input_shape": "1,3,224,224", "bandwidth": b, "latency": "0ms", "nodes": "2", "ratios": "0.2",
     "codecs": "fp16", "engine": "onnx"} for b in ("none", "1gbit")]


def sh(cmd: list[str]) -> dict:
    print("+", " ".join(cmd[2:] if cmd[:2] == DISCO[:2] else cmd), flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=ROOT).stdout  # disco plan reads ./results
    return json.loads(out.strip().splitlines()[-1])


def host_check() -> dict:
    """The one-process latency of resnet50 and cifar_resnet20 now (1 thread, median of 10 after 1) against the
    quiet-host values of results/latency.json: how much the host's load slows everything down."""
    import torch

    from disco.models import build_model
    from disco.planner import time_one_process

    torch.manual_seed(0)
    quiet = {e["model"]: e["latency_ms_median"] for e in json.loads((ROOT / "results" / "latency.json").read_text())
             ["entries"] if e["mode"] == "single"}
    out: dict = {"loadavg_1min": round(os.getloadavg()[0], 2),
                 "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    for name, shape in (("resnet50", (1, 3, 224, 224)), ("cifar_resnet20", (1, 3, 32, 32))):
        ms = time_one_process(build_model(name).eval(), shape, reps=10)
        out[name] = {"one_process_ms_now": round(ms, 2), "quiet_ms": round(quiet[name], 2),
                     "slowdown": round(ms / quiet[name], 1)}
    return out


def main() -> int:
    if sys.argv[1:] == ["--host-check"]:
        data = json.loads(OUT.read_text())
        data["host_check"] = host_check()
        OUT.write_text(json.dumps(data, indent=1))
        print(json.dumps(data["host_check"]))
        return 0
    only = sys.argv[1:] and [int(i) for i in sys.argv[1].split(",")]
    data = json.loads(OUT.read_text()) if OUT.is_file() else {"entries": []}
    data["method"] = __doc__.strip()
    for i, s in enumerate(SETTINGS):
        if only and i not in only:
            continue
        plan_cmd = [*DISCO, "plan", s["model"], "--input-shape", s["input_shape"], "--bandwidth", s["bandwidth"],
                    "--latency", s["latency"], "--nodes", s["nodes"], "--cores", "2", "--json",
                    *[x for k in ("shares", "ratios", "codecs", "engine") if k in s for x in (f"--{k}", s[k])]]
        onnx = s.get("engine") == "onnx"  # timed here already: no --time-host plan
        t0 = time.perf_counter()
        res = sh(plan_cmd)
        plan_s = time.perf_counter() - t0
        rec = res["recommended"]
        timed = res if onnx else sh([*plan_cmd, "--time-host"])
        same = [c for c in timed["candidates"] if all(c[k] == rec[k] for k in PLAN)]
        with tempfile.TemporaryDirectory() as d:
            sh([*DISCO, "export", s["model"], "--nodes", str(rec["nodes"]), "--ratio", str(rec["ratio_target"]),
                "--input-shape", s["input_shape"], "--out", d, "--codec", rec["codec"], "--json",
                *(["--format", "onnx"] if onnx else []),
                *(["--shares", ",".join(f"{x:g}" for x in rec["shares"])] if rec["shares"] else [])])
            load0 = os.getloadavg()[0]
            run = sh([*DISCO, "run", d, "--nodes", str(rec["nodes"]), "--codec", rec["codec"], "--bandwidth",
                      s["bandwidth"], "--latency", s["latency"], "--iters", "10", "--warmup", "2", "--json"])
            load1 = os.getloadavg()[0]
        e = {"setting": s, "engine": run.get("engine", "torch"),
             "recommended": {k: rec[k] for k in ("nodes", "ratio_target", "ratio", "codec", "shares")},
             "predicted_ms": rec["predicted_ms"], "measured_ms": run["latency_ms_median"],
             "measured_over_predicted": round(run["latency_ms_median"] / rec["predicted_ms"], 3),
             "predicted_ms_time_host": same[0]["predicted_ms"], "host": timed["host"],
             "recommended_time_host": {k: timed["recommended"][k] for k in PLAN},
             "measured_over_predicted_time_host": round(run["latency_ms_median"] / same[0]["predicted_ms"], 3),
             "bytes_sent": run["bytes_sent_total"], "bytes_predicted": rec["bytes"],
             "loadavg_1min_before": round(load0, 2), "loadavg_1min_after": round(load1, 2),
             "plan_seconds": round(plan_s, 1), "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        e = {k: v for k, v in e.items() if not (onnx and "time_host" in k)}
        print(json.dumps(e), flush=True)
        data["entries"] = [x for x in data["entries"] if x["setting"] != s] + [e]
        data["host_check"] = host_check()
    OUT.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
