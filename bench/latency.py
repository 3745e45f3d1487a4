"""Latency benchmark: one process vs dense within-layer parallelism vs DISCO vs separated branches.

    .venv/bin/python -m bench.latency --quick                     # cifar_resnet8, N=2, a few settings
    .venv/bin/python -m bench.latency --time-limit-minutes 30         # the sweep of issue 3 (resumable)
    .venv/bin/python -m bench.latency --report                    # README tables + plot from the JSON only

Writes results/latency.json (one entry per measurement, saved as each ends; a rerun skips those there), which
``python -m recipes.pages`` renders. Each entry's prediction is the planner's (results/latency_model.json), so
each measurement checks it on a run it was not fitted on. Link model, latency model, "tc" entries: bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.host import DRIFT, drift, host_state, speed_probe_ms, wait_idle
from bench.latency_fit import predict_setting
from bench.netns import launch_tc, netns_check, netns_cleanup
from disco import planner
from disco.procstat import peak_rss_mb
from disco.runtime import latency as lat
from disco.runtime.launch import LaunchError, launch

ROOT = Path(__file__).resolve().parents[1]
LOAD_S = 0.002  # seconds of compute between messages in the loaded ping-pong (meta.delay_loaded*, the fit's start)
EXPORTS = Path(tempfile.gettempdir()) / "disco-bench-exports"
TRACES_FILE = EXPORTS / "traces.json"  # "model|N|r|codec" -> per-node compute traces, kept beside the exports

RATIOS = [1.0, 0.2, 0.1, 0.05, 0.0]
CODECS = ["fp32", "fp16"]
BANDWIDTHS: list[float | None] = [10, 100, 1000, None]
SHAPES = {"resnet50": (1, 3, 224, 224), "cifar_resnet20": (1, 3, 32, 32), "cifar_resnet8": (1, 3, 32, 32),
          "deit_small_patch16_224": (1, 3, 224, 224), "rrdbnet": (1, 3, 64, 64),
          "deeplabv3plus_resnet50": (1, 3, 512, 512), "ssd300_vgg16_split": (1, 3, 300, 300)}
# the task models' settings (``--models deit_small_patch16_224,rrdbnet``): fp32 on the wire, N=2 then N=4;
# links in ``measured`` are run, links in ``predicted`` get the latency model's prediction only
TASK_MODELS = {
    "deit_small_patch16_224": {"ratios": (1.0, 0.2, 0.1), "measured": (100, None), "predicted": (10, 1000)},
    "rrdbnet": {"ratios": (1.0, 0.1, 0.2, 0.05), "measured": (100, None, 1000), "predicted": (10,)},
    "deeplabv3plus_resnet50": {"ratios": (1.0, 0.1, 0.2, 0.05), "measured": (100, None), "predicted": (10, 1000)},
    "ssd300_vgg16_split": {"ratios": (1.0, 0.1, 0.2, 0.05), "measured": (100, None), "predicted": (10, 1000)},
}
# repetitions of the per-node compute traces (default 15) and the first guess of a run's start-up (default 5 s)
TRACE_REPS = {"resnet50": 5, "deit_small_patch16_224": 5, "rrdbnet": 2, "deeplabv3plus_resnet50": 2,
              "ssd300_vgg16_split": 2}
TRACE_WARMUP = 5  # untimed passes per node before its traced ones (2 left a model's first trace up to 1.7x slow)
STARTUP_S = {"resnet50": 15.0, "deit_small_patch16_224": 15.0, "rrdbnet": 30.0, "deeplabv3plus_resnet50": 30.0,
             "ssd300_vgg16_split": 30.0}
NOTES = [
    "kept links: one-shot global magnitude selection on random-init weights (latency does not depend on the "
    "weight values); trained CIFAR checkpoints runs/cifar10/n{N}_r{r}.safetensors are used where they exist",
    "all node processes of a run share this host's cores (1 torch thread each): at N=4 on 2 cores at most two "
    "nodes compute at a time; the latency model shares the cores the same way (processor sharing)",
    "compute per node is measured (per node, alone, 1 thread, zero communication cost) in the benchmark "
    "process right before the runs (compute_ms_per_node: the fit's input); predicted_ms is the planner's",
    "'tc' entries: N=2, one network namespace per node, veth pair shaped by tbf on both ends, no pacing",
    "node processes run with the runtime's defaults, among them --io-nice 19 (gloo's I/O threads at niceness 19)",
]


def mode_of(r: float | None, n: int) -> str:
    return "dense" if n == 1 or r >= 1 else "separated" if r == 0 else "disco"


def iterations(predicted_ms: float) -> tuple[int, int]:
    """(timed, warm-up) inferences for a run predicted at ``predicted_ms``: 3 timed above 10 s, else 20,
    and at least 2 s of timed work up to 200 timed (a median of a few ms needs many samples)."""
    if predicted_ms > 10_000:
        return 3, 1
    return max(20, min(200, int(2000 / max(predicted_ms, 1e-3)))), 1 if predicted_ms > 1000 else 3


LAUNCH_BELOW_MS, LAUNCHES = 100.0, 3  # runs predicted faster than this are measured over LAUNCHES launches


def launches(predicted_ms: float, timed: int) -> tuple[int, int]:
    """(launches, timed per launch) for ``timed`` inferences at ``predicted_ms``: split below ``LAUNCH_BELOW_MS``
    (at least 20 each), as a ms-scale run varies up to 1.36x between launches (results/noise.json)."""
    if predicted_ms >= LAUNCH_BELOW_MS:
        return 1, timed
    return LAUNCHES, max(20, -(-timed // LAUNCHES))


def pool(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from launches of one export: timed inferences pooled, the worst error, the bytes (which must
    agree), per node the median peak memory over the launches (each launch's list kept)."""
    first = reps[0]
    for r in reps[1:]:
        if r["bytes_sent_total"] != first["bytes_sent_total"]:
            raise LaunchError(f"launches of one export sent {first['bytes_sent_total']} and "
                              f"{r['bytes_sent_total']} bytes", [], [])
    ms = [t for r in reps for t in r["latency_ms_all"]]
    return {**first, "latency_ms_all": ms, "latency_ms_median": float(np.median(ms)),
            "latency_ms_launch_medians": [round(r["latency_ms_median"], 3) for r in reps],
            "peak_rss_mb_per_node": [float(np.median(v))
                                     for v in zip(*(r["peak_rss_mb_per_node"] for r in reps), strict=True)],
            "peak_rss_mb_per_node_per_launch": [r["peak_rss_mb_per_node"] for r in reps],
            "max_rel_err_vs_single_process": max(r["max_rel_err_vs_single_process"] for r in reps)}


def key_of(e: dict[str, Any]) -> tuple:
    return (e["model"], e["mode"], e["nodes"], e.get("ratio_target"), e.get("codec"), e.get("bandwidth_mbit"),
            e.get("shaping"))


def single_main(name: str) -> None:
    """Child process: the whole model in plain PyTorch, 1 thread; prints one JSON line."""
    from disco.models import build_model
    from disco.models.ssd import SSDPost, spec_of
    from disco.timing import median_ms

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(name)
    x = torch.randn(SHAPES[name])
    with torch.no_grad():
        iters = 3 if median_ms(lambda: model(x), 1, warmup=0) > 10_000 else 20  # by the first call's time
        median = median_ms(lambda: model(x), iters)
    n_params = sum(p.numel() for p in model.parameters())
    extra = {}
    if (spec := spec_of(model)) is not None:  # a split detector: the leader's decoding + NMS, timed alone
        post = SSDPost(spec)
        with torch.no_grad():
            out = model(x)
            extra["post_ms"] = median_ms(lambda: post.detect(out, tuple(x.shape[-2:])), 5, warmup=0)
    print(json.dumps({**extra, "latency_ms_median": median, "n_timed": iters, "peak_rss_mb": peak_rss_mb(),
                      "weight_bytes": n_params * 4, "params": n_params}))


def run_single(name: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.latency", "--single", name], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads(out.stdout.strip().splitlines()[-1])


class Prepared:
    """Per (model, N): partition, the kept set at each r, the export dirs and the latency traces."""

    def __init__(self, name: str, n: int) -> None:
        from disco.graph import partition
        from disco.masks import DiscoModel
        from disco.models import build_model
        from disco.sparsify import magnitude_scores

        self.name, self.n = name, n
        torch.manual_seed(0)
        self.model = build_model(name)
        self.x = torch.randn(SHAPES[name])
        self.part = partition(self.model, self.x, n)
        self.dm = DiscoModel(self.model, self.part) if n > 1 else None
        self.scores = magnitude_scores(self.dm) if n > 1 else None
        self.dirs: dict[float, Path] = {}
        self.kept: dict[float, np.ndarray] = {}
        self.source: dict[float, str] = {}
        self.progs: dict[tuple, list] = {}
        self.probe: dict[tuple, float] = {}  # host speed probe (ms) when each trace was taken in this process

    def kept_at(self, r: float) -> np.ndarray:
        from disco.sparsify import select_links

        if r not in self.kept:
            self.kept[r] = (self.part.all_links() if self.n == 1 or r >= 1
                            else select_links(self.part, self.scores, r, "global"))
        return self.kept[r]

    def export_dir(self, r: float) -> Path:
        from disco.checkpoint import unpack_bits
        from disco.runtime.export import export
        from disco.runtime.formats import export_checkpoint

        if r in self.dirs:
            return self.dirs[r]
        d = EXPORTS / f"{self.name}_n{self.n}_r{r:g}"
        ckpt = ROOT / "runs" / "cifar10" / f"n{self.n}_r{r:g}.safetensors"
        trained = self.name == "cifar_resnet20" and self.n > 1 and 0 < r < 1 and ckpt.is_file()
        kept = None if trained else self.kept_at(r)
        if not (d / "manifest.json").is_file():
            shutil.rmtree(d, ignore_errors=True)
            if trained:
                export_checkpoint(ckpt, d)
            else:
                if self.dm is not None:
                    self.dm.set_kept(kept)
                export(self.dm if self.dm is not None else self.model, self.part, kept, d,
                       {"name": self.name, "kwargs": {}}, probe=self.x)
        if trained:
            man = json.loads((d / "manifest.json").read_text())
            self.kept[r] = unpack_bits(man["kept"], man["n_links"])
        self.source[r] = (f"trained checkpoint {ckpt.relative_to(ROOT)}" if trained
                          else "random init, one-shot global magnitude selection")
        self.dirs[r] = d
        return d

    def programs(self, r: float, codec: str) -> list:
        """The planner's programs of (r, codec): what its prediction prices."""
        if (r, codec) not in self.progs:
            self.export_dir(r)  # fixes the kept set (a trained checkpoint's, where there is one)
            self.progs[(r, codec)] = planner.programs(self.part, self.kept_at(r), codec)
        return self.progs[(r, codec)]

    def trace(self, r: float, codec: str, cache: dict[str, list], again: bool = False) -> list:
        """Each node's compute, traced alone on 1 thread (``cache``: the traces kept beside the exports; ``again``:
        trace anew, the host's speed moved since)."""
        tkey = f"{self.name}|{self.n}|{r:g}|{codec}"
        if again:
            cache.pop(tkey, None)
        if tkey not in cache:
            self.export_dir(r)
            torch.set_num_threads(1)
            self.probe[(r, codec)] = speed_probe_ms()
            cache[tkey] = lat.trace_plan(self.part, self.kept_at(r), self.x, codec,
                                         reps=TRACE_REPS.get(self.name, 15), warmup=TRACE_WARMUP)
            TRACES_FILE.write_text(json.dumps(cache))
        return cache[tkey]

    def ratio(self, r: float) -> float | None:
        return None if self.n == 1 else round(float(self.part.ratio(self.kept_at(r))), 4)


def job_list(models: list[str], quick: bool) -> list[dict[str, Any]]:
    """Every measurement, most informative first (a budget cuts from the end)."""
    if quick:
        return [dict(model="cifar_resnet8", nodes=n, r=r, codec="fp32", bw=bw, shaping=sh) for n, r, bw, sh in
                [(1, 1.0, None, None), *((2, r, bw, "pacing" if bw else None) for r in (1.0, 0.2, 0.0)
                                          for bw in (100, None)), (2, 1.0, 100, "tc")]]
    jobs: list[dict[str, Any]] = []

    def add(model: str, n: int, rs: tuple, codecs: tuple = ("fp32",), bws: tuple = (None,), shaping: str = "pacing",
            codec_first: bool = False) -> None:
        """Every (r, codec, bw) of the grid, r outermost (codec outermost with ``codec_first``), bw innermost."""
        for c, r in [(c, r) for c in codecs for r in rs] if codec_first else [(c, r) for r in rs for c in codecs]:
            for bw in bws:
                j = dict(model=model, nodes=n, r=r, codec=c, bw=bw, shaping=shaping if bw is not None else None)
                if model and j not in jobs:
                    jobs.append(j)

    big, small = models[0], models[1] if len(models) > 1 else ""
    add(big, 1, (1.0,))
    add(big, 2, (1.0, 0.2), CODECS, (100,), codec_first=True)  # headline: r=0.2 vs dense at 100 Mbit/s
    add(big, 2, RATIOS)
    add(small, 1, (1.0,))
    add(small, 2, RATIOS, bws=(100, None))
    add(big, 2, (0.1, 0.05, 0.0), CODECS, (100,))
    add(big, 2, (1.0, 0.2), bws=(100,), shaping="tc")
    add(big, 4, (1.0, 0.1), CODECS, (100,), codec_first=True)
    add(big, 2, (1.0, 0.2), bws=(1000, 10))
    add(big, 2, (0.2,), ("fp16",), (10, 1000))
    add(small, 2, (1.0, 0.2), bws=(100,), shaping="tc")
    add(small, 4, (1.0, 0.1), bws=(100, None))
    add(big, 2, (0.2, 1.0), bws=(1000,), shaping="tc")
    add(big, 2, (0.2,), bws=(10,), shaping="tc")
    add(big, 4, (1.0, 0.1, 0.2, 0.05, 0.0), bws=(None, 1000))
    add(big, 2, RATIOS, ("fp16",), (None, 1000))
    for model in (small, big):
        for n in (2, 4):
            add(model, n, RATIOS, CODECS, BANDWIDTHS)
    return jobs


def task_jobs(models: list[str]) -> list[dict[str, Any]]:
    """The task models' settings (TASK_MODELS), most informative first (a budget cuts from the end):
    N=2 before N=4, each model's first measured link before its next, predicted-only links last."""
    jobs = []
    for n in (2, 4):
        for k in range(max(len(TASK_MODELS[m]["measured"]) for m in models)):
            for model in models:
                spec = TASK_MODELS[model]
                if k < len(spec["measured"]):
                    bw = spec["measured"][k]
                    jobs += [dict(model=model, nodes=n, r=r, codec="fp32", bw=bw,
                                  shaping="pacing" if bw is not None else None) for r in spec["ratios"]]
    for model in models:
        for n in (2, 4):
            jobs += [dict(model=model, nodes=n, r=r, codec="fp32", bw=bw, shaping="pacing", predict_only=True)
                     for bw in TASK_MODELS[model]["predicted"] for r in TASK_MODELS[model]["ratios"]]
    return jobs


def job_fields(job: dict[str, Any]) -> dict[str, Any]:
    """The fields of a job's entry that identify it (``key_of`` reads them)."""
    return {"model": job["model"], "mode": mode_of(job["r"], job["nodes"]), "nodes": job["nodes"],
            "ratio_target": None if job["nodes"] == 1 else job["r"], "codec": job["codec"],
            "bandwidth_mbit": job["bw"], "shaping": job["shaping"]}


def job_key(job: dict[str, Any]) -> tuple:
    return key_of(job_fields(job))


def only_measured_in(jobs: list[dict[str, Any]], ref: Path) -> list[dict[str, Any]]:
    """The jobs whose setting ``ref`` measured; every other job becomes predicted-only."""
    measured = {key_of(e) for e in json.loads(ref.read_text())["entries"] if e.get("latency_ms_median") is not None}
    return [j if job_key(j) in measured else {**j, "predict_only": True} for j in jobs]


def measured_fields(rep: dict[str, Any], predicted_ms: float) -> dict[str, Any]:
    """An entry's fields from its pooled launch report (``pool``)."""
    ms = rep["latency_ms_all"]
    keep = ("latency_ms_median", "latency_ms_launch_medians", "bytes_sent_total", "bytes_predicted",
            "bytes_input_output", "peak_rss_mb_per_node", "peak_rss_mb_per_node_per_launch",
            "weight_bytes_per_node", "params_per_node", "params_dense", "max_rel_err_vs_single_process")
    return {**{f: rep[f] for f in keep}, "latency_ms_p10": float(np.percentile(ms, 10)),
            "latency_ms_p90": float(np.percentile(ms, 90)), "n_timed": len(ms),
            "measured_over_predicted": round(rep["latency_ms_median"] / predicted_ms, 3),
            "weight_fraction_max": round(max(rep["params_per_node"]) / rep["params_dense"], 4),
            "messages_measured": rep["messages_per_inference"]}


class Sweep:
    def __init__(self, out: Path, budget_s: float, quick: bool, fresh: bool, tc: bool) -> None:
        self.out, self.quick = out, quick
        self.deadline = time.monotonic() + budget_s
        self.data = json.loads(out.read_text()) if out.is_file() and not fresh else {"meta": {}, "entries": []}
        self.prepared: dict[tuple[str, int], Prepared] = {}
        self.startup_s: dict[str, list[float]] = {}
        self.cores = os.cpu_count() or 1
        self.tc_error = netns_check() if tc else "not requested (--no-tc)"
        if fresh:
            shutil.rmtree(EXPORTS, ignore_errors=True)
        EXPORTS.mkdir(parents=True, exist_ok=True)
        self.trace_cache = json.loads(TRACES_FILE.read_text()) if TRACES_FILE.is_file() else {}
        self.cal = planner.Calibration()  # the committed fit (results/latency_model.json)

    def save(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.out)

    def have(self, k: tuple, measured: bool = True) -> bool:
        return any(key_of(e) == k and (not measured or e.get("latency_ms_median") is not None)
                   for e in self.data["entries"])

    def put(self, e: dict[str, Any]) -> None:
        self.data["entries"] = [x for x in self.data["entries"] if key_of(x) != key_of(e)]
        self.data["entries"].append(e)
        self.save()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def prep(self, name: str, n: int) -> Prepared:
        if (name, n) not in self.prepared:
            self.prepared[(name, n)] = Prepared(name, n)
        return self.prepared[(name, n)]

    def calibrate(self) -> None:
        """The per-message delay of gloo ping-pongs (idle and loaded, plain and paced): the fit starts from it."""
        meta = self.data["meta"]
        if "delay_loaded_paced" not in meta:
            wait_idle(self.deadline)
            meta["delay"] = lat.calibrate_delay()[1]
            meta["delay_paced"] = lat.calibrate_delay(paced=True)[1]
            meta["delay_loaded"] = lat.calibrate_delay(load_s=LOAD_S)[1]
            meta["delay_loaded_paced"] = lat.calibrate_delay(paced=True, load_s=LOAD_S)[1]
            meta["calibrated_at"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            self.save()

    def single(self, name: str) -> None:
        if self.have((name, "single", 1, None, None, None, None)):
            return
        wait_idle(self.deadline)
        s = run_single(name)
        e = {"model": name, "input_shape": list(SHAPES[name]), "mode": "single", "nodes": 1, "ratio": None,
             "ratio_target": None, "codec": None, "bandwidth_mbit": None, "shaping": None,
             "latency_ms_median": s["latency_ms_median"], "predicted_ms": None, "bytes_sent_total": 0,
             "peak_rss_mb_per_node": [s["peak_rss_mb"]], "weight_bytes_per_node": [s["weight_bytes"]],
             "params_per_node": [s["params"]], "n_timed": s["n_timed"], "runtime": "plain PyTorch, 1 thread"}
        if "post_ms" in s:
            e["post_ms"] = s["post_ms"]
        self.put(e)
        print(f"{name:15s} single        N=1  measured {e['latency_ms_median']:9.2f} ms", flush=True)

    def predict(self, job: dict[str, Any], traced: bool = True, retrace: bool = False) -> dict[str, Any]:
        """The planner's prediction of ``job`` and (``traced``) each node's compute traced alone (``retrace``: anew)."""
        p = self.prep(job["model"], job["nodes"])
        progs = p.programs(job["r"], job["codec"])
        comp = ([lat.compute_s(t) * 1e3 for t in p.trace(job["r"], job["codec"], self.trace_cache, retrace)]
                if traced else None)
        return {"predicted_ms": predict_setting(progs, job_fields(job), self.cal, cores=self.cores),
                "compute_ms_per_node": comp, "messages": sum(s[0] == "s" for pr in progs for s in pr)}

    def entry(self, job: dict[str, Any], pred: dict[str, Any]) -> dict[str, Any]:
        p = self.prep(job["model"], job["nodes"])
        comp = pred["compute_ms_per_node"]
        return {**job_fields(job), "input_shape": list(SHAPES[job["model"]]), "ratio": p.ratio(job["r"]),
                "weights": p.source.get(job["r"]), "predicted_ms": round(pred["predicted_ms"], 3),
                "predicted_by": "planner", "compute_ms_per_node": comp and [round(c, 3) for c in comp],
                "messages": pred["messages"]}

    def run_job(self, job: dict[str, Any]) -> None:
        k = job_key(job)
        if self.have(k) or (job["shaping"] == "tc" and self.tc_error) or job.get("predict_only"):
            return
        wait_idle(self.deadline)
        pred = self.predict(job)
        iters, warmup = iterations(pred["predicted_ms"])
        n_launch, iters = launches(pred["predicted_ms"], iters)
        startup = float(np.median(self.startup_s.get(job["model"], [STARTUP_S.get(job["model"], 5.0)])))
        est = n_launch * (startup + (iters + warmup) * pred["predicted_ms"] / 1e3 * 1.3) + 5
        if est > self.left() - 60:  # keep a minute for the predicted-only entries and the outputs
            print(f"skip (budget): {k} needs ~{est:.0f} s, {self.left():.0f} s left", flush=True)
            return
        opts = ["--codec", job["codec"], "--iters", str(iters), "--warmup", str(warmup), "--timeout", "120",
                "--startup-timeout", "60", "--threads", "1"]
        if job["shaping"] != "tc" and job["bw"] is not None:
            opts += ["--bandwidth", f"{job['bw']:g}mbit"]
        try:
            rep, pred, probe, attempt, wall = self.measure(job, pred, opts, n_launch, est * 3 + 120)
        except (LaunchError, subprocess.CalledProcessError, OSError) as ex:
            print(f"FAILED {k}: {ex}", flush=True)
            self.put({**self.entry(job, pred), "latency_ms_median": None, "error": str(ex)[:500]})
            return
        run_s = sum(rep["latency_ms_all"]) / 1e3 * (iters + warmup) / iters
        self.startup_s.setdefault(job["model"], []).append(max(1.0, (wall - run_s) / n_launch))
        e = {**self.entry(job, pred), **measured_fields(rep, pred["predicted_ms"]), "warmup": warmup,
             "launches": n_launch, "host_probe_ms": {t: None if v is None else round(v, 3) for t, v in probe.items()},
             "host_drift": round(drift(*probe.values()), 3), "retraced": bool(attempt), "wall_s": round(wall, 1),
             **host_state()}
        self.put(e)
        bw = "loopback" if job["bw"] is None else f"{job['bw']:g} Mbit/s"
        print(f"{job['model']:15s} {e['mode']:9s} N={job['nodes']} r={job['r']:<5g} {job['codec']} {bw:12s} "
              f"{job['shaping'] or '':6s} measured {e['latency_ms_median']:9.2f} ms  predicted "
              f"{pred['predicted_ms']:9.2f} ms  x{e['measured_over_predicted']:.2f}  "
              f"[{wall:.0f} s, {self.left():.0f} s left]", flush=True)

    def measure(self, job: dict[str, Any], pred: dict[str, Any], opts: list[str],
                n_launch: int, timeout: float) -> tuple[dict, dict, dict, int, float]:
        """Launch ``job``'s export ``n_launch`` times and pool the reports; once more, re-traced, when the host's
        speed moved since the trace. Returns (report, prediction, host probes, attempt, wall seconds of it)."""
        prep = self.prep(job["model"], job["nodes"])
        d = prep.export_dir(job["r"])
        wait_idle(self.deadline)
        for attempt in range(2):
            t0 = time.monotonic()  # the startup estimate counts the last attempt only
            before = speed_probe_ms()
            reps = [launch_tc(d, job["bw"], opts, timeout=timeout) if job["shaping"] == "tc"
                    else launch(d, job["nodes"], opts, timeout=timeout) for _ in range(n_launch)]
            rep, after = pool(reps), speed_probe_ms()
            probe = {"trace": prep.probe.get((job["r"], job["codec"])), "before": before, "after": after}
            dr = drift(*probe.values())
            if dr <= DRIFT or attempt:
                break
            print(f"host speed moved {dr:.2f}x since the trace (probe {probe}): re-trace and measure "
                  f"{job_key(job)} again", flush=True)
            pred = self.predict(job, retrace=True)
        return rep, pred, probe, attempt, time.monotonic() - t0

    def predicted_only(self, jobs: list[dict[str, Any]]) -> None:
        from disco.cost import estimate

        for job in jobs:
            k = job_key(job)
            if (job["shaping"] == "tc" and self.tc_error) or self.have(k, measured=False):
                continue
            if self.left() < 20:
                print("no time left for more predicted-only entries", flush=True)
                return
            try:
                pred = self.predict(job, traced=False)
            except Exception as ex:  # noqa: BLE001
                print(f"cannot predict {k}: {ex}", flush=True)
                continue
            p = self.prep(job["model"], job["nodes"])
            rep = estimate(p.part, p.kept_at(job["r"]), bytes_per_value=2 if job["codec"] == "fp16" else 4)
            self.put({**self.entry(job, pred), "latency_ms_median": None, "predicted_only": True,
                      "bytes_sent_total": None, "bytes_predicted": rep.bytes, "peak_rss_mb_per_node": None,
                      "weight_bytes_per_node": [4 * x for x in rep.params_per_node], "params_dense": rep.params_dense,
                      "weight_fraction_max": round(max(rep.params_per_node) / rep.params_dense, 4)})

    def run(self, jobs: list[dict[str, Any]], models: list[str]) -> None:
        meta = self.data["meta"]
        meta.update({
            "link_model": "each node's interface limited to the bandwidth, full duplex, all nodes behind one "
                          "non-blocking switch (disco.runtime.transport.LinkModel; pacing emulates it on loopback, "
                          "'tc' entries shape a veth pair between two network namespaces with tbf instead)",
            "latency_model": "predicted_ms: the planner's (disco.planner, the committed fit of "
                             "bench.latency_fit) for entries with predicted_by 'planner'; older entries: the "
                             "sweep's retired first-order model (bench/ARCHIVE.md)",
            "host_cpus": self.cores, "threads_per_node": 1, "torch": torch.__version__,
            "tc": "ok" if self.tc_error is None else f"not run: {self.tc_error}",
            "quick": self.quick,
            "notes": NOTES,
            "iterations": "median of the timed inferences after 3 warm-up (1 warm-up above 1 s): 20, or as many "
                          "as fill 2 s up to 200; 3 timed above 10 s predicted; below "
                          f"{LAUNCH_BELOW_MS:g} ms predicted, split over {LAUNCHES} launches (at least 20 timed "
                          "each, each with its own warm-up) and pooled",
        })
        self.save()
        self.calibrate()
        for name in models:
            self.single(name)
        for job in jobs:
            if self.left() < 90:
                print("budget spent", flush=True)
                break
            self.run_job(job)
        self.predicted_only(jobs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="cifar_resnet8, N=2, a few settings (development)")
    p.add_argument("--out", default=None, help="default results/latency.json (latency_quick.json with --quick)")
    p.add_argument("--time-limit-minutes", type=float, default=600.0, help="measure for this long; predict the rest")
    p.add_argument("--models", default="resnet50,cifar_resnet20")
    p.add_argument("--fresh", action="store_true", help="ignore the existing JSON and exports")
    p.add_argument("--no-tc", action="store_true", help="skip the kernel-shaping (netns + tc) runs")
    p.add_argument("--report", action="store_true", help="only regenerate the tables and the plot (recipes.pages)")
    p.add_argument("--keys-from", default=None, help="measure only what this JSON measured; the rest is predicted")
    p.add_argument("--single", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.single:
        single_main(a.single)
        return
    out = Path(a.out or ROOT / "results" / ("latency_quick.json" if a.quick else "latency.json"))
    main_out = out.resolve() == (ROOT / "results" / "latency.json").resolve()
    if not a.report:
        models = ["cifar_resnet8"] if a.quick else [m for m in a.models.split(",") if m]
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        sweep = Sweep(out, a.time_limit_minutes * 60, a.quick, a.fresh, not a.no_tc)
        jobs = task_jobs(models) if set(models) <= set(TASK_MODELS) else job_list(models, a.quick)
        if a.keys_from:
            jobs = only_measured_in(jobs, Path(a.keys_from))
        try:
            sweep.run(jobs, models)
        finally:
            with contextlib.suppress(Exception):
                netns_cleanup()
    if main_out:  # the pages and the plot come from the JSON, rendered by recipes.pages only
        subprocess.run([sys.executable, "-m", "recipes.pages"], check=True, cwd=ROOT)
    else:
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
