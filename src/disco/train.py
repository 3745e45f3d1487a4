"""A small, resumable training loop shared by every task (dense training and DISCO fine-tuning)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
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
    if channels_last is None:
        channels_last = dev.type == "cuda"
    model.to(dev)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    if teacher is not None:
        teacher.to(dev)
        if channels_last:
            teacher.to(memory_format=torch.channels_last)
    steps_per_epoch = len(train_loader)  # type: ignore[arg-type]
    total = epochs * steps_per_epoch if steps is None else steps
    if steps is not None and epochs != -(-steps // steps_per_epoch):
        raise ValueError(f"{steps} steps of {steps_per_epoch} per epoch need {-(-steps // steps_per_epoch)} "
                         f"epochs, not {epochs}")
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim > 1 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True)
    elif optimizer == "adam":
        opt = torch.optim.Adam(groups, lr=lr, betas=(0.9, 0.99))
    elif optimizer == "adamw":  # decoupled weight decay (transformers)
        opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999))
    else:
        raise ValueError(f"optimizer must be 'sgd', 'adam' or 'adamw', got {optimizer!r}")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_with_warmup(total, int(warmup_epochs * steps_per_epoch)))
    history: list[dict[str, float]] = []
    start_epoch = 0
    state_path = Path(state_path) if state_path else None
    if state_path and state_path.is_file():
        st = load_state(state_path)
        if hook is not None:
            hook.load_state_dict(st["hook"])  # masks first: they shape the model's state
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optim"])
        sched.load_state_dict(st["sched"])
        start_epoch, history = st["epoch"], st["history"]
        torch.set_rng_state(st["rng"])
        if start_epoch >= epochs:
            notice.info("%s: all %d epochs were trained already; not training again (delete it to start over)",
                        state_path, epochs)
        else:
            notice.info("resuming from %s at epoch %d/%d", state_path, start_epoch + 1, epochs)
    if teacher is not None:
        teacher.eval()
    net: nn.Module = model
    if D.active():
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
        if hook is not None and not isinstance(hook, D.KeptFromRankZero) and hasattr(hook, "dm"):
            hook = D.KeptFromRankZero(hook)  # type: ignore[arg-type]
    log.info("%s: %d step(s) per epoch on %s, %d process(es), global batch %s%s", desc, steps_per_epoch, dev,
             D.world(), _global_batch(train_loader), f", autocast {amp}" if amp else "")
    scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for epoch in range(start_epoch, epochs):
        net.train()
        if hasattr(train_loader, "set_epoch"):
            train_loader.set_epoch(epoch)
        tot, n, recent = 0.0, 0, 0.0
        bar = tqdm(train_loader, desc=f"{desc} {epoch + 1}/{epochs}", leave=False, dynamic_ncols=True,
                   disable=not D.is_main())
        for i, (x, y) in enumerate(bar):
            if epoch * steps_per_epoch + i >= total:  # the length in steps ends inside this epoch
                break
            if dev.type != "cpu":
                x, y = to_device(x, dev, fmt), to_device(y, dev, None)
            with D.autocast(dev, amp):
                out = net(x)
                loss = loss_fn(out, y)
                if teacher is not None and distill_fn is not None and distill_weight > 0:
                    with torch.no_grad():
                        t_out = teacher(x)
                    loss = (1 - distill_weight) * loss + distill_weight * distill_fn(out, t_out)
            opt.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            sched.step()
            if hook is not None:
                hook(epoch * steps_per_epoch + i + 1, total)
            v = loss.item()
            tot += v * len(y)
            n += len(y)
            recent = v if i == 0 else 0.9 * recent + 0.1 * v  # the bar shows the recent loss, not the mean
            bar.set_postfix(loss=f"{recent:.4f}", lr=f"{sched.get_last_lr()[0]:.4g}", refresh=False)
        tot, n = D.all_reduce_sum([tot, float(n)])
        D.sync_buffers(model)
        rec = {"epoch": epoch + 1, "loss": tot / max(n, 1), "images": n}
        if on_epoch is not None:
            rec.update(on_epoch(epoch + 1))
        history.append(rec)
        log.info("%s epoch %d/%d %s", desc, epoch + 1, epochs, {k: round(v, 4) for k, v in rec.items()})
        if state_path and D.is_main():
            save_state({
                "epoch": epoch + 1, "model": model.state_dict(), "optim": opt.state_dict(),
                "sched": sched.state_dict(), "history": history, "rng": torch.get_rng_state(),
                "hook": hook.state_dict() if hook is not None else None,
            }, state_path)
        D.barrier()  # no rank runs ahead of the state that a resume would start from
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
