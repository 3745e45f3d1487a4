"""A small, resumable training loop shared by every task (dense training and DISCO fine-tuning)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from tqdm import tqdm

from . import distributed as D

log = logging.getLogger(__name__)
notice = logging.getLogger("disco.notice")  # shown without -v by the command line (resume, skip)


class StepHook(Protocol):
    """Called after every optimiser step (the pruning schedule is one); must be resumable."""

    def __call__(self, step: int, total_steps: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _plain(obj: Any) -> Any:
    """Training state in types that ``torch.load(weights_only=True)`` reads: NumPy arrays become
    ``{"__ndarray__": tensor}`` and NumPy scalars Python numbers (:func:`_numpy` reverses it)."""
    import numpy as np

    if isinstance(obj, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj))}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    return obj


def _numpy(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__ndarray__"}:
            return obj["__ndarray__"].numpy()
        return {k: _numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_numpy(v) for v in obj)
    return obj


def save_state(state: dict[str, Any], path: Path) -> None:
    """Write resumable training state atomically, loadable with ``weights_only=True``."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(_plain(state), tmp)
    tmp.replace(path)


def load_state(path: Path) -> dict[str, Any]:
    """Read what :func:`save_state` wrote; nothing in the file is executed (``weights_only=True``)."""
    try:
        return _numpy(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as e:  # an older state file, or not ours
        raise ValueError(f"cannot resume from {path}: {type(e).__name__}: {str(e).splitlines()[0][:200]} "
                         "(delete it to start over)") from e


def cosine_with_warmup(total: int, warmup: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return f


OPTIMIZERS: dict[str, Callable[[list[dict[str, Any]], float], torch.optim.Optimizer]] = {
    "sgd": lambda groups, lr: torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True),
    "adam": lambda groups, lr: torch.optim.Adam(groups, lr=lr, betas=(0.9, 0.99)),
    "adamw": lambda groups, lr: torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999)),  # decoupled weight decay
}


def make_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """One of :data:`OPTIMIZERS`, with weight decay on the weights (ndim > 1) only."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be 'sgd', 'adam' or 'adamw', got {name!r}")
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim > 1 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return OPTIMIZERS[name](groups, lr)


def _total_steps(epochs: int, steps: int | None, steps_per_epoch: int) -> int:
    if steps is None:
        return epochs * steps_per_epoch
    if epochs != -(-steps // steps_per_epoch):
        raise ValueError(f"{steps} steps of {steps_per_epoch} per epoch need {-(-steps // steps_per_epoch)} "
                         f"epochs, not {epochs}")
    return steps


def _place(modules: list[nn.Module | None], dev: torch.device, channels_last: bool) -> None:
    for m in modules:
        if m is not None:
            m.to(dev)
            if channels_last:
                m.to(memory_format=torch.channels_last)


@dataclass
class _Run:
    """What every step of one :func:`fit` needs."""

    model: nn.Module
    net: nn.Module  # the model, or its DistributedDataParallel wrapper
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    opt: torch.optim.Optimizer
    sched: Any
    hook: StepHook | None
    dev: torch.device
    amp: str | None
    fmt: torch.memory_format
    total: int
    steps_per_epoch: int
    teacher: nn.Module | None = None
    distill_fn: Callable[[Tensor, Tensor], Tensor] | None = None
    distill_weight: float = 0.0
    scaler: Any = None


def _resume(r: _Run, state_path: Path | None, epochs: int) -> tuple[int, list[dict[str, float]]]:
    """The epoch to start from and the history so far (0 and [] without a state file)."""
    if not (state_path and state_path.is_file()):
        return 0, []
    st = load_state(state_path)
    if r.hook is not None:
        r.hook.load_state_dict(st["hook"])  # masks first: they shape the model's state
    r.model.load_state_dict(st["model"])
    r.opt.load_state_dict(st["optim"])
    r.sched.load_state_dict(st["sched"])
    torch.set_rng_state(st["rng"])
    if st["epoch"] >= epochs:
        notice.info("%s: all %d epochs were trained already; not training again (delete it to start over)",
                    state_path, epochs)
    else:
        notice.info("resuming from %s at epoch %d/%d", state_path, st["epoch"] + 1, epochs)
    return st["epoch"], st["history"]


def _distribute(r: _Run) -> None:
    """Under torch.distributed: DistributedDataParallel, and the hook's kept links from rank 0."""
    if not D.active():
        return
    from torch.nn.parallel import DistributedDataParallel

    r.net = DistributedDataParallel(r.model, device_ids=[r.dev.index] if r.dev.type == "cuda" else None)
    if r.hook is not None and not isinstance(r.hook, D.KeptFromRankZero) and hasattr(r.hook, "dm"):
        r.hook = D.KeptFromRankZero(r.hook)  # type: ignore[arg-type]


def _step(r: _Run, x: Any, y: Any, step: int) -> float:
    """One optimiser step (``step`` counts from 1); returns the loss."""
    if r.dev.type != "cpu":
        x, y = to_device(x, r.dev, r.fmt), to_device(y, r.dev, None)
    with D.autocast(r.dev, r.amp):
        out = r.net(x)
        loss = r.loss_fn(out, y)
        if r.teacher is not None and r.distill_fn is not None and r.distill_weight > 0:
            with torch.no_grad():
                t_out = r.teacher(x)
            loss = (1 - r.distill_weight) * loss + r.distill_weight * r.distill_fn(out, t_out)
    r.opt.zero_grad(set_to_none=True)
    if r.scaler is not None:
        r.scaler.scale(loss).backward()
        r.scaler.step(r.opt)
        r.scaler.update()
    else:
        loss.backward()
        r.opt.step()
    r.sched.step()
    if r.hook is not None:
        r.hook(step, r.total)
    return loss.item()


def _epoch(r: _Run, loader: Any, epoch: int, epochs: int, desc: str) -> tuple[float, int]:
    """One epoch (or its part up to the run's last step): the summed loss and the images seen, over ranks."""
    r.net.train()
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    tot, n, recent = 0.0, 0, 0.0
    bar = tqdm(loader, desc=f"{desc} {epoch + 1}/{epochs}", leave=False, dynamic_ncols=True, disable=not D.is_main())
    for i, (x, y) in enumerate(bar):
        if epoch * r.steps_per_epoch + i >= r.total:  # the length in steps ends inside this epoch
            break
        v = _step(r, x, y, epoch * r.steps_per_epoch + i + 1)
        tot += v * len(y)
        n += len(y)
        recent = v if i == 0 else 0.9 * recent + 0.1 * v  # the bar shows the recent loss, not the mean
        bar.set_postfix(loss=f"{recent:.4f}", lr=f"{r.sched.get_last_lr()[0]:.4g}", refresh=False)
    tot, n = D.all_reduce_sum([tot, float(n)])
    D.sync_buffers(r.model)
    return tot, n


def _save(r: _Run, state_path: Path | None, epoch: int, history: list[dict[str, float]]) -> None:
    """Rank 0 writes the resumable state after ``epoch`` epochs; no rank runs ahead of it."""
    if state_path and D.is_main():
        save_state({
            "epoch": epoch, "model": r.model.state_dict(), "optim": r.opt.state_dict(),
            "sched": r.sched.state_dict(), "history": history, "rng": torch.get_rng_state(),
            "hook": r.hook.state_dict() if r.hook is not None else None,
        }, state_path)
    D.barrier()  # no rank runs ahead of the state that a resume would start from


def fit(
    model: nn.Module,
    train_loader: Iterable[tuple[Tensor, Tensor]],
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    *,
    epochs: int,
    steps: int | None = None,
    lr: float = 0.1,
    weight_decay: float = 5e-4,
    warmup_epochs: float = 1.0,
    state_path: str | Path | None = None,
    teacher: nn.Module | None = None,
    distill_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
    distill_weight: float = 0.0,
    hook: StepHook | None = None,
    on_epoch: Callable[[int], dict[str, float]] | None = None,
    desc: str = "train",
    optimizer: str = "sgd",
    device: torch.device | str | None = None,
    amp: str | None = None,
    channels_last: bool | None = None,
) -> list[dict[str, float]]:
    """Train with SGD (momentum 0.9, Nesterov), Adam (``"adam"``, betas 0.9/0.99) or AdamW (``"adamw"``),
    cosine schedule with warmup.

    With ``state_path`` the run checkpoints after every epoch and continues from there
    when started again. ``teacher`` with ``distill_fn`` adds ``distill_weight * distill_fn``.
    Returns one dict per epoch (loss and whatever ``on_epoch`` measured). ``steps`` (optional) ends the run
    after that many optimiser steps, inside an epoch if need be (the length as images seen, not epochs);
    ``epochs`` must then be ``ceil(steps / steps per epoch)``.

    ``device`` (default: where the model is) and ``amp`` (``"bf16"``/``"fp16"`` autocast, CUDA only)
    choose how it runs; ``channels_last`` (default: on CUDA) sets the memory format of 4-d inputs and
    weights. Under torch.distributed (torchrun) the model is wrapped in DistributedDataParallel, the
    loss is averaged over ranks, and only rank 0 writes the resumable state; the hook's kept links
    are rank 0's (see :class:`disco.distributed.KeptFromRankZero`).
    """
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    amp = D.check_amp(amp, dev)
    channels_last = dev.type == "cuda" if channels_last is None else channels_last
    _place([model, teacher], dev, channels_last)
    steps_per_epoch = len(train_loader)  # type: ignore[arg-type]
    total = _total_steps(epochs, steps, steps_per_epoch)
    opt = make_optimizer(model, optimizer, lr, weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_with_warmup(total, int(warmup_epochs * steps_per_epoch)))
    r = _Run(model, model, loss_fn, opt, sched, hook, dev, amp,
             torch.channels_last if channels_last else torch.contiguous_format, total, steps_per_epoch,
             teacher, distill_fn, distill_weight)
    state_path = Path(state_path) if state_path else None
    start_epoch, history = _resume(r, state_path, epochs)
    if teacher is not None:
        teacher.eval()
    _distribute(r)
    log.info("%s: %d step(s) per epoch on %s, %d process(es), global batch %s%s", desc, steps_per_epoch, dev,
             D.world(), _global_batch(train_loader), f", autocast {amp}" if amp else "")
    r.scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
    for epoch in range(start_epoch, epochs):
        tot, n = _epoch(r, train_loader, epoch, epochs, desc)
        rec = {"epoch": epoch + 1, "loss": tot / max(n, 1), "images": n}
        if on_epoch is not None:
            rec.update(on_epoch(epoch + 1))
        history.append(rec)
        log.info("%s epoch %d/%d %s", desc, epoch + 1, epochs, {k: round(v, 4) for k, v in rec.items()})
        _save(r, state_path, epoch + 1, history)
    if channels_last:
        model.to(memory_format=torch.contiguous_format)
    return history


def to_device(x: Any, dev: torch.device, fmt: torch.memory_format | None = None) -> Any:
    """``x`` on ``dev``: tensors, and the lists, tuples and dicts of them a task's batches hold (detection targets)."""
    if isinstance(x, Tensor):
        x = x.to(dev, non_blocking=True)
        return x.contiguous(memory_format=fmt) if fmt is not None and x.dim() == 4 else x
    if isinstance(x, (list, tuple)):
        return type(x)(to_device(v, dev, fmt) for v in x)
    if isinstance(x, dict):
        return {k: to_device(v, dev, fmt) for k, v in x.items()}
    return x


def _global_batch(loader: Any) -> str:
    b = getattr(loader, "batch_size", None) or getattr(getattr(loader, "loader", None), "batch_size", None)
    return f"{b} x {D.world()} = {b * D.world()}" if b else "unknown"
