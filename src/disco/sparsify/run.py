"""The DISCO training procedure: dense checkpoint -> DISCO checkpoint at a target ratio."""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

from .. import distributed as D
from ..cost import estimate
from ..graph import Partition, partition
from ..loading import load, save_disco
from ..masks import DiscoModel
from ..seed import seed_everything
from ..tasks import Task, get_task
from ..train import cosine_with_warmup, fit, to_device
from .prune import GradualPruner
from .scores import taylor_scores
from .select import DEFAULT_MAX_FLOPS, DEFAULT_MAX_WEIGHTS_PER_NODE, joint_weights, link_costs

log = logging.getLogger(__name__)


@dataclass
class SparsifyConfig:
    """How to sparsify: N (and unequal shares), the target ratio r, the budget, the link scores and the
    fine-tuning."""

    nodes: int = 2
    shares: tuple[float, ...] | None = None  # node j's share of every layer's channels (None: equal)
    ratio: float = 0.2
    budget: str = "global"  # or "layer", "joint"
    max_flops: float = DEFAULT_MAX_FLOPS  # joint budget: total FLOPs / dense
    max_weights_per_node: float = DEFAULT_MAX_WEIGHTS_PER_NODE  # joint budget: weights of a node / whole model
    latency_weight: float = 0.0  # global budget: values charged per message kept (ranking only)
    selection: str = "lasso"  # or "magnitude", "taylor", "random" (lasso: the best measured, docs/selection.md)
    lasso: float = 2.0  # group-lasso strength at the end of its growth (selection "lasso")
    lasso_weight: str = "bytes"  # or "joint": each group charged its share of bytes, FLOPs and weight rooms
    epochs: int = 10
    prune_fraction: float = 0.5  # share of the run during which r goes down
    lr: float | None = None  # None: the task's finetune_lr (0.02 for cifar10)
    weight_decay: float | None = None  # None: the task's weight_decay (5e-4 for cifar10)
    optimizer: str | None = None  # None: the task's (sgd for cifar10)
    batch_size: int = 128
    distill: float = 0.0  # weight of the distillation loss from the dense model
    every: int = 25  # steps between pruning updates
    limit: int | None = None
    train_subset: int | None = None  # fine-tune on this many training images, a fixed subset per seed
    train_images: int | None = None  # the run's length as images seen (replaces epochs; may end mid-epoch)
    val_split: int = 0  # images carved from the training set for validation (val_ metrics), never trained on
    seed: int = 0  # governs everything random: data order, augmentation, random links, init
    device: str | None = None  # auto/None (cuda when present), cpu or cuda
    amp: str | None = None  # bf16 or fp16 autocast (CUDA only)
    workers: int | None = None  # loader worker processes (image-folder task)


LASSO_WEIGHTS = ("bytes", "joint")


def _lasso_weights(part: Partition, cfg: SparsifyConfig, joint: dict[str, Any]) -> np.ndarray | None:
    """The group lasso's charge per link: None (its bytes) or, for ``lasso_weight="joint"``, its share of the
    joint budget's three rooms (the lasso then also acts on the capped FLOPs and weights)."""
    if cfg.lasso_weight not in LASSO_WEIGHTS:
        raise ValueError(f"lasso_weight must be one of {LASSO_WEIGHTS}, got {cfg.lasso_weight!r}")
    if cfg.lasso_weight == "bytes":
        return None
    if cfg.budget != "joint" or cfg.selection != "lasso":
        raise ValueError("lasso_weight='joint' needs the joint budget and lasso selection")
    return joint_weights(part, cfg.ratio, joint["max_flops"], joint["max_weights_per_node"], joint["costs"])


def _holdout(loader: Any, cfg: SparsifyConfig, task: str) -> Any:
    if not cfg.val_split:
        return None
    if not hasattr(loader, "holdout"):
        raise ValueError(f"task {task!r} cannot carve a validation split (--val-split)")
    return loader.holdout(cfg.val_split)


def _subset(loader: Any, cfg: SparsifyConfig, task: str) -> Any:
    if cfg.train_subset is None:
        return loader
    if not hasattr(loader, "restrict"):
        raise ValueError(f"task {task!r} cannot fine-tune on a training subset (--train-subset)")
    return loader.restrict(cfg.train_subset, cfg.seed)


@dataclass
class Loaders:
    """What fine-tuning needs besides the model: batches, the loss and, optionally, a metric.

    ``train`` yields ``(input, target)`` batches and has a length (steps per epoch). ``evaluate(model, test)``
    returns a dict of metrics (none without it). ``distill(out, teacher_out)`` is needed when
    ``SparsifyConfig.distill > 0``. ``calibration`` gives the batches of Taylor scores (default: ``train``).
    ``lr``, ``weight_decay`` and ``optimizer`` are used where the config leaves them None.
    """

    train: Iterable[Any]
    test: Iterable[Any] | None = None
    loss: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy
    evaluate: Callable[[nn.Module, Iterable[Any]], dict[str, float]] | None = None
    distill: Callable[[Tensor, Tensor], Tensor] | None = None
    calibration: Iterable[Any] | None = None
    lr: float = 0.02
    weight_decay: float = 5e-4
    optimizer: str = "sgd"
    val: Iterable[Any] | None = None  # a validation split carved from the training set (val_ metrics)

    @classmethod
    def from_task(cls, task: Task, data: str, cfg: SparsifyConfig) -> Loaders:
        """A registered task's loaders (``cfg``'s batch size, limit, training subset and seed), loss, metric
        and fine-tuning defaults, on the dataset folder ``data``."""
        train, test = task.loaders(data, cfg.batch_size, limit=cfg.limit, seed=cfg.seed)
        val = _holdout(train, cfg, task.name)
        calib = None
        if cfg.selection == "taylor":
            calib_train = task.loaders(data, 64, limit=cfg.limit, seed=cfg.seed + 1)[0]
            _holdout(calib_train, cfg, task.name)
            calib = _subset(calib_train, cfg, task.name)
        return cls(_subset(train, cfg, task.name), test, task.loss, task.evaluate, task.distill, calib,
                   lr=getattr(task, "finetune_lr", 0.02), weight_decay=getattr(task, "weight_decay", 5e-4),
                   optimizer=getattr(task, "optimizer", "sgd"), val=val)


def sparsify_model(model: nn.Module, loaders: Loaders, cfg: SparsifyConfig,
                   example: Tensor | tuple[int, ...], state_path: str | Path | None = None,
                   ) -> tuple[DiscoModel, dict[str, Any], dict[str, Any]]:
    """Partition ``model`` (in place) on ``example`` and fine-tune it into a DISCO model at ``cfg.ratio``.

    Returns the DISCO model, the result entry (nodes, achieved ratio, metrics, cost) and what a checkpoint
    records (``metrics``, ``history`` and the ``config`` with the values used). ``state_path`` makes the run
    resumable. Seeds everything from ``cfg.seed`` first. Runs on ``cfg.device`` (the model is back on the CPU
    when it returns); under torchrun (:mod:`disco.distributed`) data-parallel, every rank keeping rank 0's links.
    """
    seed_everything(cfg.seed)
    device = D.resolve_device(cfg.device)
    D.check_amp(cfg.amp, device)
    if cfg.distill > 0 and loaders.distill is None:
        raise ValueError("distill > 0 needs a distillation loss (Loaders.distill)")
    teacher = copy.deepcopy(model).eval() if cfg.distill > 0 else None
    part = partition(model, example, cfg.nodes, cfg.shares)
    dm = DiscoModel(model, part)
    per_epoch = len(loaders.train)  # type: ignore[arg-type]
    if cfg.train_images is not None:  # the length as images seen: whole steps, the last epoch cut short
        if cfg.train_images < cfg.batch_size:
            raise ValueError(f"train_images={cfg.train_images} is less than one batch of {cfg.batch_size}")
        steps = -(-cfg.train_images // cfg.batch_size)
        cfg = replace(cfg, epochs=-(-steps // per_epoch))
    else:
        steps = cfg.epochs * per_epoch
    taylor_fn = None
    if cfg.selection == "taylor":
        calib = loaders.calibration if loaders.calibration is not None else loaders.train
        taylor_fn = lambda d: taylor_scores(  # noqa: E731
            d, ((to_device(x, device), to_device(y, device)) for x, y in itertools.islice(iter(calib), 4)),
            loaders.loss)
    lr = cfg.lr if cfg.lr is not None else loaders.lr
    wd = cfg.weight_decay if cfg.weight_decay is not None else loaders.weight_decay
    cfg = replace(cfg, lr=lr, weight_decay=wd)  # the checkpoint records the values used
    warmup = min(0.3, cfg.epochs) if cfg.train_images is None else min(0.3, 0.1 * steps / per_epoch)
    lr_factor = cosine_with_warmup(steps, int(warmup * per_epoch))
    joint = {"max_flops": cfg.max_flops, "max_weights_per_node": cfg.max_weights_per_node,
             "costs": link_costs(part)} if cfg.budget == "joint" else {}
    lasso_weights = _lasso_weights(part, cfg, joint)
    if cfg.latency_weight:
        joint["latency_weight"] = cfg.latency_weight
    pruner = D.KeptFromRankZero(GradualPruner(  # under torchrun every rank keeps rank 0's links
        dm, cfg.ratio, int(cfg.prune_fraction * steps), budget=cfg.budget, selection=cfg.selection,
        every=cfg.every, taylor_fn=taylor_fn, seed=cfg.seed, lasso=cfg.lasso,
        lr_at=lambda s: lr * lr_factor(s),  # the schedule fit() follows
        select_options=joint, lasso_weights=lasso_weights))
    if cfg.epochs == 0:
        pruner(pruner.prune_steps, pruner.prune_steps)
    hist = fit(dm, loaders.train, loaders.loss, epochs=cfg.epochs, steps=steps, lr=lr, weight_decay=wd,
               optimizer=cfg.optimizer or loaders.optimizer,
               warmup_epochs=warmup, state_path=state_path,
               teacher=teacher, distill_fn=loaders.distill, distill_weight=cfg.distill, hook=pruner,
               desc=f"sparsify N={cfg.nodes} r={cfg.ratio}", device=device, amp=cfg.amp)
    if not pruner.done:
        pruner(pruner.prune_steps, pruner.prune_steps)
    metrics = loaders.evaluate(dm, loaders.test) if loaders.evaluate and loaders.test is not None else {}
    if loaders.evaluate and loaders.val is not None:
        metrics.update({f"val_{k}": v for k, v in loaders.evaluate(dm, loaders.val).items()})
    rep = estimate(part, dm.kept)
    result = {
        "nodes": cfg.nodes, "shares": list(part.shares) if part.shares else None,
        "ratio": rep.ratio, "target_ratio": cfg.ratio, "budget": cfg.budget, "lasso_weight": cfg.lasso_weight,
        "latency_weight": cfg.latency_weight,
        "selection": cfg.selection if cfg.ratio > 0 else "separated", **metrics,
        "train_images_seen": int(sum(h.get("images", 0) for h in hist)), "epochs": cfg.epochs,
        "bytes": rep.bytes, "dense_bytes": rep.dense_bytes, "stats_bytes": rep.stats_bytes,
        "flops_total": rep.flops_total, "flops_dense": rep.flops_dense, "params_per_node": rep.params_per_node,
        "params_dense": rep.params_dense, "messages_per_inference": rep.messages_per_inference,
    }
    if D.world() > 1:
        result["processes"] = D.world()
    dm.to("cpu")
    log.info("sparsified: %s", result)
    return dm, result, {"metrics": metrics, "history": hist, "config": asdict(cfg)}


def sparsify(dense: str | Path, data: str, out: str | Path, cfg: SparsifyConfig,
             return_model: bool = False) -> Any:
    """Fine-tune the dense checkpoint ``dense`` into a DISCO model at ``cfg.ratio``; resumable.

    Returns the result entry (nodes, achieved ratio, metrics, cost) and writes ``out`` (rank 0 only
    under torchrun); with ``return_model`` returns ``(result, DiscoModel)``.
    """
    from ..tasks.classification import task_options

    seed_everything(cfg.seed)
    loaded = load(dense)
    if loaded.partition is not None:
        raise ValueError(f"{dense} is already a DISCO checkpoint; start from a dense one")
    ckpt = loaded.ckpt
    task = get_task(ckpt.task or "cifar10")
    task_options(task, ckpt.info, ckpt.input_shape)
    if hasattr(task, "configure"):
        task.configure(workers=cfg.workers, amp=cfg.amp)
    if (D.active() or D.resolve_device(cfg.device).type != "cpu") and not getattr(task, "supports_ddp", False):
        raise ValueError(f"task {task.name!r} runs in one CPU process only; torchrun and --device cuda "
                         "work for classification (cifar10, imagefolder)")
    loaders = Loaders.from_task(task, data, cfg)
    out = Path(out)
    dm, result, info = sparsify_model(loaded.model, loaders, cfg, tuple(ckpt.input_shape),
                                      state_path=out.with_name(out.name + ".state.pt"))
    for key in ("classes", "preprocess"):  # what the network was trained on travels with it
        if key in ckpt.info:
            info[key] = ckpt.info[key]
    if D.is_main():
        save_disco(dm, out, ckpt.model, task=task.name, info={**info, "dense": str(dense)},
                   extra={"budget": cfg.budget, "selection": result["selection"]})
    D.barrier()
    return (result, dm) if return_model else result
