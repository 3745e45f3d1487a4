"""The public Python API: split a model, choose its links, cost it, fine-tune it, export it and run it.

Every name here is re-exported from :mod:`disco` (``disco.partition``, ``disco.run``, ...); the ``disco``
command line is a thin layer over these functions.

    import disco, torchvision
    model = torchvision.models.resnet18()
    dm = disco.DiscoModel(model, disco.partition(model, (1, 3, 64, 64), nodes=2))
    dm.set_kept(disco.select_links(dm, ratio=0.2))
    disco.export(dm, "out/resnet18.export", arch="resnet18")
    report = disco.run("out/resnet18.export", nodes=2)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor, nn

from .cost import CostReport
from .cost import estimate as _estimate
from .graph import Partition
from .graph import partition as _partition
from .masks import DiscoModel
from .sparsify.run import Loaders, SparsifyConfig
from .tasks import Task

log = logging.getLogger(__name__)

__all__ = ["CostReport", "DiscoModel", "Loaders", "Partition", "SparsifyConfig", "estimate", "evaluate", "export",
           "partition", "run", "select_links", "sparsify_checkpoint", "sparsify_model", "train_checkpoint"]


def partition(model: nn.Module, example: Tensor | tuple[int, ...], nodes: int,
              shares: tuple[float, ...] | list[float] | None = None) -> Partition:
    """Trace ``model`` on ``example`` (a tensor or an input shape, batch included) and split every layer's
    channels over ``nodes`` nodes: the ownership of every feature tensor and the links between nodes.

    ``shares`` gives unequal nodes a proportional part of every layer's channels (e.g. ``(2, 1)``: node 0 owns
    two thirds); None splits equally. Raises :class:`disco.graph.UnsupportedOpError` naming an op that no rule
    describes.
    """
    return _partition(model, example, nodes, None if shares is None else tuple(shares))


def _part_of(model: DiscoModel | Partition) -> Partition:
    if isinstance(model, DiscoModel):
        return model.partition
    if isinstance(model, Partition):
        return model
    raise TypeError(f"expected a DiscoModel or a Partition, got {type(model).__name__}")


def select_links(model: DiscoModel, ratio: float, *, budget: str = "global",
                 scores: str | np.ndarray = "magnitude", seed: int = 0, **budget_options: Any) -> np.ndarray:
    """The links to keep for communication ratio ``ratio`` (kept bytes / bytes of dense within-layer
    parallelism): a boolean array over ``model.partition``'s links, for :meth:`DiscoModel.set_kept`.

    ``scores``: ``"magnitude"`` (norm of the weight columns a link feeds), ``"random"``, or an array with one
    score per link (e.g. :func:`disco.sparsify.taylor_scores`). ``budget``: ``"global"`` ranks links by score
    per byte across all layers; ``"layer"`` keeps the share ``ratio`` of every tensor's links; ``"joint"`` adds
    caps on FLOPs and weights per node (``max_flops=``, ``max_weights_per_node=``: fractions of dense).
    """
    from .sparsify import magnitude_scores, random_scores
    from .sparsify import select_links as _select

    part = _part_of(model)
    if isinstance(scores, str):
        if scores == "magnitude":
            scores = magnitude_scores(model)
        elif scores == "random":
            scores = random_scores(part.n_links, seed)
        else:
            raise ValueError(f"scores must be 'magnitude', 'random' or an array of link scores, got {scores!r}")
    return _select(part, scores, ratio, budget, **budget_options)


def estimate(model: DiscoModel | Partition, kept: np.ndarray | None = None,
             bytes_per_value: int = 4) -> CostReport:
    """Bytes moved, FLOPs, weights and peak activation memory per node (the cost model).

    For a :class:`DiscoModel` the default ``kept`` is its own kept set; for a :class:`Partition`, every link
    (dense within-layer parallelism).
    """
    if kept is None and isinstance(model, DiscoModel):
        kept = model.kept
    return _estimate(_part_of(model), kept, bytes_per_value=bytes_per_value)


def sparsify_model(model: nn.Module, task_or_loaders: str | Task | Loaders, config: SparsifyConfig | None = None,
                   *, data: str | Path | None = None,
                   example: Tensor | tuple[int, ...] | None = None) -> tuple[DiscoModel, dict[str, Any]]:
    """Fine-tune ``model`` (in place, nothing written to disk) into a DISCO model at ``config.ratio``.

    ``task_or_loaders``: a :class:`Loaders` (your batches, loss and optional metric), or a registered task
    (its name, e.g. ``"cifar10"``, or the object) together with its dataset folder ``data``. ``example`` is the
    input (or its shape) the model is partitioned on; default: the task's input shape, else one sample of the
    first training batch. Returns the DISCO model and the result entry (achieved ratio, metrics, cost).
    """
    from .sparsify.run import sparsify_model as _sparsify
    from .tasks import get_task

    cfg = config or SparsifyConfig()
    if isinstance(task_or_loaders, Loaders):
        loaders = task_or_loaders
    else:
        task = get_task(task_or_loaders) if isinstance(task_or_loaders, str) else task_or_loaders
        if data is None:
            raise ValueError(f"task {task.name!r} needs its dataset folder: pass data=...")
        loaders = Loaders.from_task(task, str(data), cfg)
        example = task.input_shape if example is None else example
    if example is None:
        x = next(iter(loaders.train))[0]
        example = (1, *x.shape[1:])
    dm, result, _ = _sparsify(model, loaders, cfg, example)
    return dm, result


def train_checkpoint(task: str, data: str | Path, out: str | Path, *, model: str | None = None,
                     weights: str | Path | None = None, epochs: int = 30, lr: float | None = None,
                     weight_decay: float | None = None, optimizer: str | None = None, batch_size: int = 128,
                     limit: int | None = None, seed: int = 0, eval_every: bool = False,
                     num_classes: int | None = None, image_size: int | None = None, workers: int | None = None,
                     cache_dir: str | None = None, device: str | None = None,
                     amp: str | None = None) -> dict[str, Any]:
    """Train a dense model of a registered ``task`` on the dataset folder ``data`` into the checkpoint ``out``
    (the starting point of DISCO; resumable: ``OUT.state.pt`` is written after every epoch).

    ``model`` defaults to the task's; ``lr``, ``weight_decay`` and ``optimizer`` to the task's. Returns
    ``{"checkpoint": out, **metrics}`` (the task's metrics on its test split). ``num_classes`` replaces the
    ``weights`` file's classifier head by a new one; ``image_size``, ``workers`` and ``cache_dir`` are options of
    the ``imagefolder`` task; ``device`` (auto/cpu/cuda) and ``amp`` (bf16/fp16, CUDA) choose how it runs. Under
    torchrun (:mod:`disco.distributed`) the run is data-parallel and rank 0 writes ``out``.
    """
    from . import distributed as D
    from .checkpoint import Checkpoint, save_checkpoint
    from .errors import RefusedError
    from .models import build_model
    from .seed import seed_everything
    from .tasks import get_task
    from .train import fit

    if epochs == 0 and weights is None:
        raise RefusedError("--epochs must be > 0 unless --weights gives the checkpoint to write "
                         "(--epochs 0 with no --weights would write an untrained model)")
    options = dict(task=task, data=str(data), out=str(out), model=model,
                   weights=None if weights is None else str(weights), epochs=epochs, lr=lr, wd=weight_decay,
                   optimizer=optimizer, batch_size=batch_size, limit=limit, seed=seed, eval_every=eval_every,
                   num_classes=num_classes, image_size=image_size, device=device, amp=amp, processes=D.world())
    t = get_task(task)
    dev = D.resolve_device(device)
    amp = D.check_amp(amp, dev)
    if (D.active() or dev.type != "cpu") and not getattr(t, "supports_ddp", False):
        raise ValueError(f"task {t.name!r} runs in one CPU process only; torchrun and --device cuda work "
                         "for classification (cifar10, imagefolder)")
    if hasattr(t, "configure"):
        t.configure(image_size=image_size, workers=workers, cache=cache_dir, amp=amp)
    elif image_size is not None or num_classes is not None:
        raise ValueError(f"--image-size and --num-classes are options of --task imagefolder, not {t.name}")
    seed_everything(seed)
    name = model or t.default_model
    train_loader, test = t.loaders(str(data), batch_size, limit=limit, seed=seed)
    kwargs = dict(t.model_kwargs)  # after loaders(): an image folder's class count
    if num_classes is not None and kwargs.get("num_classes") not in (None, num_classes):
        raise ValueError(f"--num-classes {num_classes}, but {data} has {kwargs['num_classes']} classes")
    net = build_model(name, weights=weights, new_head=num_classes is not None, **kwargs)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)  # once the data and the model were read
    lr = lr if lr is not None else getattr(t, "lr", 0.1)
    wd = weight_decay if weight_decay is not None else getattr(t, "weight_decay", 5e-4)
    hist = fit(net, train_loader, t.loss, epochs=epochs, lr=lr, weight_decay=wd,
               state_path=out.with_name(out.name + ".state.pt"),
               optimizer=optimizer or getattr(t, "optimizer", "sgd"),
               on_epoch=(lambda e: t.evaluate(net, test)) if eval_every else None, desc="train",
               device=dev, amp=amp)
    metrics = t.evaluate(net, test)
    net.to("cpu")
    info: dict[str, Any] = {"metrics": metrics, "history": hist, "args": options,
                            "preprocess": t.preprocess(net) if hasattr(t, "preprocess") else None}
    if getattr(t, "classes", None):
        info["classes"] = t.classes
    if D.is_main():
        save_checkpoint(Checkpoint(model={"name": name, "kwargs": kwargs}, state_dict=net.state_dict(),
                                   input_shape=list(t.input_shape), task=t.name, info=info), out)
    D.barrier()
    extra = {"processes": D.world(), "global_batch": batch_size * D.world()} if D.world() > 1 else {}
    return {"checkpoint": str(out), **metrics, **extra}


def evaluate(checkpoint: str | Path, data: str | Path, *, batch_size: int = 500,
             limit: int | None = None, device: str | None = None, amp: str | None = None,
             workers: int | None = None) -> dict[str, Any]:
    """Evaluate a dense or DISCO checkpoint on its task's test split: the task's metrics, with the checkpoint's
    model, task, N and ratio, and the seconds it took. ``device``/``amp``/``workers`` as in :func:`train`;
    under torchrun every rank evaluates its share and the metrics are summed over the ranks."""
    import time

    from . import distributed as D
    from .loading import load
    from .tasks import get_task
    from .tasks.classification import task_options

    dev = D.resolve_device(device)
    amp = D.check_amp(amp, dev)
    loaded = load(checkpoint)
    task = get_task(loaded.ckpt.task or "cifar10")
    task_options(task, loaded.ckpt.info, loaded.ckpt.input_shape)
    if hasattr(task, "configure"):
        task.configure(workers=workers, amp=amp)
    if (D.active() or dev.type != "cpu") and not getattr(task, "supports_ddp", False):
        raise ValueError(f"task {task.name!r} is evaluated in one CPU process only (use --device cpu)")
    _, test = task.loaders(str(data), batch_size, limit=limit)
    t0 = time.perf_counter()
    metrics = task.evaluate(loaded.model.to(dev), test)
    return {"checkpoint": str(checkpoint), "model": loaded.ckpt.model["name"], "task": task.name,
            "nodes": loaded.ckpt.nodes, "ratio": loaded.ckpt.disco["ratio"] if loaded.ckpt.disco else 1.0,
            **metrics, "seconds": round(time.perf_counter() - t0, 2)}


def sparsify_checkpoint(checkpoint: str | Path, data: str | Path, out: str | Path,
                        config: SparsifyConfig | None = None) -> dict[str, Any]:
    """:func:`sparsify_model` from a dense checkpoint of a registered task into the DISCO checkpoint ``out``
    (resumable, like :func:`train_checkpoint`); returns the result entry (achieved ratio, metrics, cost)."""
    from .sparsify.run import sparsify

    return sparsify(checkpoint, str(data), out, config or SparsifyConfig())


def _arch_spec(arch: str | dict[str, Any] | None) -> dict[str, Any]:
    if arch is None:
        raise ValueError("export needs the architecture's name, e.g. arch='resnet18' (a registered, torchvision "
                         "or timm model; or {'name': ..., 'kwargs': {...}}): each node rebuilds it from that name")
    return {"name": arch, "kwargs": {}} if isinstance(arch, str) else {"kwargs": {}, **arch}


def _num_classes(model: nn.Module) -> int | None:
    """The class count of a classifier's head (its last Linear's outputs), None without one."""
    from .models import classifier_head

    head = classifier_head(model)
    return None if head is None else int(model.get_submodule(head).out_features)


def export(model: DiscoModel | str | Path, out_dir: str | Path, *, arch: str | dict[str, Any] | None = None,
           codec: str = "fp32", probe: Tensor | None = None, fmt: str = "torch") -> dict[str, Any]:
    """Write one weight shard per node and a manifest into ``out_dir``; returns the manifest.

    ``model`` is a :class:`DiscoModel` (its kept links decide which weight columns each node holds; ``arch``
    names the architecture the nodes rebuild, e.g. ``"resnet18"``) or the path of a DISCO checkpoint (which
    records its architecture). ``codec`` is the default wire codec recorded in the manifest; ``probe`` the
    input whose single-process output the nodes check against (default: a seeded random input). The model is
    put in eval mode (the nodes run inference). ``fmt="onnx"``: one folder per rank of ONNX graphs instead.
    """
    from .runtime.formats import export_checkpoint, exporter

    if isinstance(model, str | Path):
        if arch is not None or probe is not None:
            raise ValueError("a checkpoint brings its own architecture and probe: drop arch= and probe=")
        return export_checkpoint(model, out_dir, codec=codec, fmt=fmt)
    if not isinstance(model, DiscoModel):
        raise TypeError(f"export takes a DiscoModel or a checkpoint path, got {type(model).__name__}")
    model.eval()  # the nodes run inference: the reference output must not use batch statistics
    return exporter(fmt)(model, model.partition, model.kept, out_dir, _arch_spec(arch), codec=codec, probe=probe)


def export_model_name(name: str, out: str | Path, nodes: int, ratio: float,
                      input_shape: tuple[int, ...] | None = None, shares: tuple[float, ...] | None = None,
                      budget: str = "global", codec: str = "fp32", weights: str | None = None, seed: int = 0,
                      latency_weight: float = 0.0, fmt: str = "torch", **caps: float) -> dict[str, Any]:
    """The pipeline name -> partition -> select -> export for a bare architecture (random init, or the state dict
    ``weights``) with links chosen by weight magnitude at ``ratio``, as ``disco cost MODEL`` costs it: for latency
    and memory, not for accuracy. ``latency_weight``: bytes charged per message kept (the global budget's
    ``--latency-weight``); ``fmt``: "torch" or "onnx" (:func:`export`); ``caps``: the joint budget's
    ``max_flops`` and ``max_weights_per_node``. Returns the manifest."""
    import torch

    from .errors import RefusedError
    from .models import build_model, preprocess_of
    from .runtime.formats import exporter
    from .sparsify import magnitude_scores
    from .sparsify import select_links as _select
    from .validate import check_input_shape, check_nodes_fit, default_input_shape

    torch.manual_seed(seed)
    model = build_model(name, weights=weights).eval()
    input_shape = input_shape or default_input_shape(name, model)
    check_input_shape(model, input_shape, name)
    check_nodes_fit(model, nodes, name)
    if shares and len(shares) != nodes:
        raise RefusedError(f"--shares has {len(shares)} values for --nodes {nodes}")
    if latency_weight and budget != "global":
        raise RefusedError("--latency-weight applies to the global budget only")
    part = _partition(model, tuple(input_shape), nodes, shares)
    dm = DiscoModel(model, part)
    kept = (_select(part, magnitude_scores(dm), ratio, budget, latency_weight=latency_weight / 4, **caps)
            if ratio < 1 else part.all_links())
    dm.set_kept(kept)
    lw = f", latency weight {latency_weight:g} bytes per message" if latency_weight else ""
    return exporter(fmt)(dm.eval(), part, kept, out, {"name": name, "kwargs": {}}, codec=codec,
                   info={"source": f"model name {name}, {'given weights' if weights else 'random init'}, "
                                   f"magnitude links at r={ratio:g} ({budget} budget{lw})",
                         **({"preprocess": preprocess_of(model, _num_classes(model), input_shape[-1])}
                            if weights else {})})


def run(export_dir: str | Path, nodes: int, *, run_timeout: float = 3600.0, options: Any = None,
        progress: Callable[[int, int], None] | None = None,
        **kw: Any) -> dict[str, Any]:
    """Run an export as ``nodes`` local processes (gloo on 127.0.0.1) and return the leader's report, the same
    object as ``disco run --json``: latency, throughput, bytes sent beside the cost model's, the error against
    the single-process model, memory and weights per node.

    Options are a :class:`disco.runtime.options.RunOptions` (``options=``) or its fields as keywords:
    ``codec``, ``bandwidth`` (e.g. ``"100mbit"``), ``latency`` (``"2ms"``), ``input`` (a tensor file),
    ``data``/``limit`` (also run the task's test split), ``warmup``, ``iters``, ``stream``, ``timeout``,
    ``startup_timeout``, ``threads``. ``run_timeout`` bounds the whole run; ``progress(done, total)`` is called
    while the test split of ``data`` runs. Raises
    :class:`disco.errors.RefusedError` (a ``ValueError``) for options, an export or an input that do not
    fit (nothing started) and :class:`disco.runtime.launch.LaunchError` when a node fails or refuses.
    """
    from .errors import RefusedError
    from .runtime.export import read_manifest
    from .runtime.inputs import load_input
    from .runtime.launch import launch
    from .runtime.options import RunOptions

    opts = RunOptions.from_kwargs(**kw) if options is None else options.replace(**kw)
    opts.check()
    d = Path(export_dir)
    man = read_manifest(d)
    if nodes != man["nodes"]:
        raise RefusedError(f"{d} was exported for {man['nodes']} nodes, not {nodes}")
    if opts.input is not None:  # refuse a wrong input here, before starting anything
        load_input(str(opts.input), man, d)
    return launch(d, nodes, opts, timeout=run_timeout, progress=progress)

