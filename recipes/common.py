"""What every recipe shares: its runs as data (:class:`Run`) and one driver for all tasks.

A recipe is a :class:`Recipe`: a task, a model, the dense training and fine-tuning settings and a list of
:class:`Run` rows. :func:`drive` does the rest, the same for every task: train the dense model (unless its
checkpoint exists), evaluate and cost it, fine-tune every DISCO run (in parallel processes, each resumable and
skipped when done), build the result entries and copy the committed checkpoints. Every step calls the Python
API (``disco.train_checkpoint``, ``disco.evaluate``, ``disco.sparsify_checkpoint``, ``disco.estimate``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Run:
    """One DISCO run: fine-tune the dense model over ``nodes`` nodes at ratio ``ratio`` into ``runs/NAME``.

    ``epochs`` and ``lr`` default to the recipe's (``--epochs``, its fine-tuning rate); ``ratio = 0`` is
    separated branches.
    """

    name: str
    nodes: int
    ratio: float
    epochs: int | None = None
    selection: str = "magnitude"  # or "taylor", "random"
    budget: str = "global"  # or "layer"
    lr: float | None = None
    distill: float | None = None  # None: the recipe's


@dataclass
class Recipe:
    """What differs between the recipes; :func:`drive` does the rest."""

    task: str  # a registered disco task (cifar10, sr_x4, camvid, det_generated, ...)
    model: str
    input_shape: tuple[int, ...]  # where the model is costed (the task's partition shape)
    runs: list[Run]
    metrics: Callable[[dict], dict]  # a task result -> the entry's metric fields
    dense_epochs: int
    epochs: int  # fine-tuning epochs of a run that does not say
    distill: float
    train: dict[str, Any] = field(default_factory=dict)  # train_checkpoint keywords (lr, optimizer, ...)
    finetune: dict[str, Any] = field(default_factory=dict)  # SparsifyConfig fields (lr, optimizer, batch_size, ...)
    committed: dict[str, str] = field(default_factory=dict)  # run name -> checkpoint file under the assets
    dense_name: str = "dense"  # runs/DENSE_NAME.safetensors, and the dense entry's name
    extra: dict[str, Any] = field(default_factory=dict)  # fields every entry of this recipe carries
    limit: int | None = None  # images per split (smoke runs)


def ratio_sweep(control: bool = True) -> list[Run]:
    """The task recipes' ratio sweep, global budget and magnitude scores: N=2 at r = 0.5, 0.2, 0.1, 0.05 and 0
    (separated branches), N=4 at r = 0.1 and 0; with ``control`` first N=2 at r = 1 (every link kept, the same
    fine-tuning: what the fine-tuning alone changes)."""
    runs = [Run("n2_r1", 2, 1.0)] if control else []
    return runs + [Run(f"n{n}_r{r:g}", n, r) for n, r in ((2, 0.5), (2, 0.2), (2, 0.1), (2, 0.05), (2, 0.0),
                                                          (4, 0.1), (4, 0.0))]


def add_args(p: argparse.ArgumentParser, *, runs: Path | None, dense_epochs: int, epochs: int,
             dense_threads: tuple[str, ...] = ("--threads",), dense_threads_default: int = 1) -> None:
    """The options every recipe has, with the recipe's defaults."""
    p.add_argument("--runs", default=None if runs is None else str(runs), help="run folder: checkpoints and JSON")
    p.add_argument("--results", default=str(ROOT / "results"))
    p.add_argument("--assets", default=str(ROOT / "src" / "disco" / "assets"),
                   help="where the committed checkpoints are copied")
    p.add_argument("--dense-epochs", type=int, default=dense_epochs)
    p.add_argument("--epochs", type=int, default=epochs, help="fine-tuning epochs of a run that does not say")
    p.add_argument("--distill", type=float, default=0.5, help="weight of distillation from the dense model")
    p.add_argument("--limit", type=int, help="images per split (smoke runs)")
    p.add_argument(*dense_threads, dest="dense_threads", type=int, default=dense_threads_default,
                   help="torch threads of the dense training")
    p.add_argument("--workers", type=int, default=2, help="DISCO runs in parallel (one thread each)")
    p.add_argument("--only", nargs="*", help="run only these names (e.g. n2_r0.1)")


def add_image_task_args(p: argparse.ArgumentParser, *, data: str, data_help: str, model: str, runs: Path,
                        dense_epochs: int, epochs: int, batch_size: int, optimizer: str) -> None:
    """The options of the dense-then-DISCO image-to-image recipes (super-resolution, segmentation)."""
    p.add_argument("--data", default=data, help=data_help)
    p.add_argument("--model", default=model)
    add_args(p, runs=runs, dense_epochs=dense_epochs, epochs=epochs)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--lr", type=float, default=1e-3, help=f"dense {optimizer} learning rate (cosine to 0)")
    p.add_argument("--ft-lr", type=float, default=5e-4, help=f"DISCO fine-tuning {optimizer} learning rate")


def cached(path: Path, fn: Callable[[], dict], source: Path | None = None) -> dict:
    """``fn()``'s result, stored in ``path`` so that a rerun skips it (unless ``source`` is newer)."""
    if path.is_file() and (source is None or path.stat().st_mtime >= source.stat().st_mtime):
        return json.loads(path.read_text())
    res = fn()
    path.write_text(json.dumps(res))
    return res


def _threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(n)


def sparsify_cached(runs: Path, dense: Path, data: str, name: str, config: dict, threads: int | None = 1,
                    **fields: Any) -> dict:
    """``disco.sparsify_checkpoint`` of ``dense`` into ``runs/NAME.safetensors`` with the SparsifyConfig fields
    ``config``; its result, with ``name``, ``epochs`` and ``fields``, is kept in ``runs/NAME.json``. Skipped when
    both files exist (an interrupted run resumes from its ``.state.pt``)."""
    out, res_file = runs / f"{name}.safetensors", runs / f"{name}.json"
    if out.is_file() and res_file.is_file():
        return json.loads(res_file.read_text())
    import disco

    _threads(threads)
    print(f"+ sparsify {name}: {json.dumps(config)}", flush=True)
    res = disco.sparsify_checkpoint(dense, data, out, disco.SparsifyConfig(**config))
    res.update(name=name, **fields)
    res.setdefault("epochs", config["epochs"])
    res_file.write_text(json.dumps(res))
    return res


def run_config(recipe: Recipe, run: Run) -> dict:
    """The SparsifyConfig fields of ``run``: the recipe's fine-tuning settings, then what the row says."""
    cfg = {**recipe.finetune, "nodes": run.nodes, "ratio": run.ratio, "budget": run.budget,
           "selection": run.selection, "epochs": run.epochs or recipe.epochs,
           "distill": recipe.distill if run.distill is None else run.distill, "limit": recipe.limit}
    if run.lr is not None:
        cfg["lr"] = run.lr
    return cfg


def sparsify_runs(recipe: Recipe, runs: Path, dense: Path, data: str, todo: list[Run], workers: int) -> list[dict]:
    """Fine-tune the runs of ``todo`` (:func:`sparsify_cached`: each skipped when done), ``workers`` at a time in
    fresh processes; return the results of every run of the recipe that is done, also those of earlier
    invocations. A result records the row's ``lr`` when the row sets one."""
    jobs = [(runs, dense, data, r.name, run_config(recipe, r), 1) for r in todo]
    fields = [{"lr": r.lr} if r.lr is not None else {} for r in todo]
    if workers > 1 and len(jobs) > 1:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that has started torch threads
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            for f in [pool.submit(sparsify_cached, *j, **kw) for j, kw in zip(jobs, fields, strict=True)]:
                f.result()
    else:
        for j, kw in zip(jobs, fields, strict=True):
            sparsify_cached(*j, **kw)
    return [json.loads((runs / f"{r.name}.json").read_text()) for r in recipe.runs
            if (runs / f"{r.name}.json").is_file()]


def dense_model(recipe: Recipe, runs: Path, data: str, threads: int | None) -> tuple[Path, dict, dict]:
    """The dense checkpoint (trained unless it exists), its evaluation and its cost at N=2 (both cached)."""
    import disco
    from disco.models import build_model

    _threads(threads)
    dense = runs / f"{recipe.dense_name}.safetensors"
    if not dense.is_file():
        print(f"+ train {dense}: {recipe.model} on {recipe.task}, {recipe.dense_epochs} epochs", flush=True)
        disco.train_checkpoint(recipe.task, data, dense, model=recipe.model, epochs=recipe.dense_epochs,
                               limit=recipe.limit, **recipe.train)
    ev = cached(dense.with_suffix(".json"), lambda: disco.evaluate(dense, data, limit=recipe.limit), source=dense)

    def cost() -> dict:
        rep = disco.estimate(disco.partition(build_model(recipe.model), recipe.input_shape, 2))
        return {"dense_bytes": rep.dense_bytes, "flops_dense": rep.flops_dense, "params_dense": rep.params_dense}

    return dense, ev, cached(runs / f"{recipe.dense_name}_cost.json", cost)


def dense_entry(recipe: Recipe, ev: dict, cost: dict) -> dict:
    """The results entry of the dense model (one device)."""
    return {"name": recipe.dense_name, "model": recipe.model, **recipe.extra, "nodes": 1, "ratio": 1.0,
            "budget": None, "selection": "dense", **recipe.metrics(ev), "bytes": 0,
            "dense_bytes_n2": cost["dense_bytes"], "flops_total": cost["flops_dense"],
            "params_per_node": [cost["params_dense"]], "input_shape": list(recipe.input_shape),
            "epochs": recipe.dense_epochs, "checkpoint": None}


def run_entry(recipe: Recipe, r: dict) -> dict:
    """The results entry of one finished run (``r``: its sparsify result with name, epochs, lr)."""
    return {"name": r["name"], "model": recipe.model, **recipe.extra, "nodes": r["nodes"], "ratio": r["ratio"],
            "target_ratio": r["target_ratio"], "budget": r["budget"], "selection": r["selection"],
            **recipe.metrics(r), "bytes": r["bytes"], "dense_bytes": r["dense_bytes"],
            "stats_bytes": r.get("stats_bytes"), "flops_total": r["flops_total"], "flops_dense": r["flops_dense"],
            "params_per_node": r["params_per_node"], "params_dense": r["params_dense"],
            "input_shape": list(recipe.input_shape), "epochs": r.get("epochs", recipe.epochs),
            "lr": r.get("lr", recipe.finetune.get("lr")), "distill": recipe.distill, "checkpoint": None}


def copy_assets(entries: list[dict], committed: dict[str, str], runs: Path, dense: Path, assets: Path | None) -> None:
    """Copy the committed checkpoints (small ones, under 5 MB) into ``assets`` and record their path."""
    if assets is None:
        return
    assets.mkdir(parents=True, exist_ok=True)
    for e in entries:
        src = dense if e["selection"] == "dense" else runs / f"{e['name']}.safetensors"
        if e["name"] in committed and src.is_file() and src.stat().st_size < 5e6:
            dst = assets / committed[e["name"]]
            shutil.copyfile(src, dst)
            e["checkpoint"] = str(dst.relative_to(ROOT)) if dst.is_relative_to(ROOT) else str(dst)


def drive(recipe: Recipe, data: str, runs: Path, args: argparse.Namespace, assets: Path | None = None) -> list[dict]:
    """dense -> evaluate -> cost -> sparsify every run -> entries -> committed checkpoints; returns the entries
    (the dense one first, then every finished run of the recipe, also those of earlier invocations).
    ``args``: the options of :func:`add_args` (workers, dense_threads, only)."""
    runs.mkdir(parents=True, exist_ok=True)
    dense, ev, cost = dense_model(recipe, runs, data, args.dense_threads)
    todo = [r for r in recipe.runs if not args.only or r.name in args.only]
    done = sparsify_runs(recipe, runs, dense, data, todo, args.workers)
    entries = [dense_entry(recipe, ev, cost)] + [run_entry(recipe, r) for r in done]
    copy_assets(entries, recipe.committed, runs, dense, assets)
    return entries


def save_figure(fig: Any, out: str | Path, dpi: int = 120) -> Path:
    """Lay out and write a matplotlib figure (folders made as needed), then close it; returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def write_results(entries: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries, indent=1) + "\n")
    print(f"wrote {path}")
    return path


def with_args(recipe: Recipe, args: argparse.Namespace) -> Recipe:
    """``recipe`` with the common command-line options applied (epochs, distillation, limit)."""
    return replace(recipe, dense_epochs=args.dense_epochs, epochs=args.epochs, distill=args.distill, limit=args.limit)
