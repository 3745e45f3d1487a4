"""Devices, mixed precision and data parallelism (torchrun + DistributedDataParallel) for training.

- :func:`resolve_device`: ``auto`` (CUDA when present), ``cpu`` or ``cuda``; ``cuda`` without a GPU is a
  one-line error.
- :func:`autocast`: bf16/fp16 autocast on CUDA (fp16 with a gradient scaler in the training loop).
- :func:`init_from_env`: under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) start the process
  group: NCCL when training on GPUs, gloo on CPUs. The helpers below are no-ops in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda")
AMP = ("bf16", "fp16")


def add_device_args(p: argparse.ArgumentParser) -> None:
    """--device, --amp and --workers (train, sparsify, eval)."""
    p.add_argument("--device", choices=DEVICES, default="auto", help="auto = cuda when present (default)")
    p.add_argument("--amp", choices=AMP, help="autocast on CUDA (bf16, or fp16 with loss scaling); refused on CPU")
    p.add_argument("--workers", type=int, help="imagefolder: DataLoader worker processes (default: min(4, CPU count))")


def resolve_device(name: str | None) -> torch.device:
    """``auto``/None -> cuda when available else cpu; under torchrun, cuda is ``cuda:LOCAL_RANK``."""
    name = name or "auto"
    if name not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA GPU is visible to PyTorch (use --device cpu or auto)")
        local = int(os.environ.get("LOCAL_RANK", 0))
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} GPU(s) are visible")
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def check_amp(amp: str | None, device: torch.device) -> str | None:
    """Validate ``--amp`` for ``device``: refused on the CPU (autocast there is slower than fp32)."""
    if amp is None or amp == "none":
        return None
    if amp not in AMP:
        raise ValueError(f"--amp must be one of {', '.join(AMP)}, got {amp!r}")
    if device.type != "cuda":
        raise ValueError(f"--amp {amp} needs a CUDA device (this run is on {device.type}); drop --amp on the CPU")
    if amp == "bf16" and not torch.cuda.is_bf16_supported():
        raise ValueError("--amp bf16: this GPU has no bf16 support; use --amp fp16")
    return amp


def autocast(device: torch.device, amp: str | None) -> contextlib.AbstractContextManager:
    """The autocast context for ``amp`` (a no-op context when ``amp`` is None)."""
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


def under_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


_DATA_PARALLEL = False  # set by init_from_env/attach: a process group alone (the inference runtime's) is not DDP


def init_from_env(device: torch.device, timeout_s: float = 600.0) -> bool:
    """Start the process group when launched by torchrun with more than one process; True if started."""
    global _DATA_PARALLEL
    if not under_torchrun():
        return False
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    _DATA_PARALLEL = True
    log.info("torch.distributed: rank %d of %d (%s)", rank(), world(), dist.get_backend())
    return True


def attach() -> None:
    """Train data-parallel over the process group that the caller has initialised."""
    global _DATA_PARALLEL
    if not dist.is_initialized():
        raise RuntimeError("attach(): torch.distributed is not initialised")
    _DATA_PARALLEL = True


def shutdown() -> None:
    global _DATA_PARALLEL
    if _DATA_PARALLEL and dist.is_initialized():
        dist.destroy_process_group()
    _DATA_PARALLEL = False


def active() -> bool:
    """True while training data-parallel over more than one process."""
    return _DATA_PARALLEL and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if active():
        dist.barrier()


def _comm_device() -> torch.device:
    """Where collective tensors live: the current GPU for NCCL, the CPU for gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum a few numbers over ranks (float64)."""
    if not active():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return t.cpu().tolist()


def broadcast_bool(array: np.ndarray) -> np.ndarray:
    """Rank 0's copy of a boolean array on every rank."""
    if not active():
        return array
    t = torch.from_numpy(np.asarray(array, dtype=np.uint8)).to(_comm_device())
    dist.broadcast(t, 0)
    return t.cpu().numpy().astype(bool)


def sync_buffers(model: torch.nn.Module) -> None:
    """Copy rank 0's buffers (BatchNorm running statistics, masks) to every rank.

    DDP broadcasts buffers before each forward, so after the last training step every rank has
    updated its own running statistics: this makes the ranks hold one model again (for evaluation
    and for the weights that rank 0 saves)."""
    if not active():
        return
    for b in model.buffers():
        dist.broadcast(b.data, 0)


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first (e.g. unpacking a dataset into the cache), the others after it."""
    if is_main():
        yield
        barrier()
    else:
        barrier()
        yield


class KeptFromRankZero:
    """Wrap a pruning hook (with ``dm``, ``every``, ``prune_steps``, ``done``) so that every rank keeps
    rank 0's links: after each step at which the hook may prune, rank 0's kept set is broadcast.

    Scores computed from data (Taylor) differ between ranks; weights are equal under DDP but the
    float results of a score need not be bit-identical everywhere. Broadcasting the decision makes the
    kept sets identical by construction.
    """

    def __init__(self, hook: object) -> None:
        self.hook = hook

    def __getattr__(self, name: str) -> object:
        return getattr(self.__dict__["hook"], name)

    def __call__(self, step: int, total_steps: int) -> None:
        h = self.hook
        was_done = h.done
        h(step, total_steps)
        if active() and not was_done and (step % h.every == 0 or step >= h.prune_steps):
            kept = broadcast_bool(h.dm.kept)
            if not np.array_equal(kept, h.dm.kept):
                log.debug("rank %d: kept links replaced by rank 0's at step %d", rank(), step)
                h.dm.set_kept(kept)
            done = broadcast_bool(np.array([h.done]))
            h.done = bool(done[0])

    def state_dict(self) -> dict:
        return self.hook.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.hook.load_state_dict(state)
