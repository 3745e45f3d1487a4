"""Run all N node programs as threads of one process (fast checks of the plans, no sockets)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..graph import Partition
from ..schedule import build
from .executor import Executor
from .plan import RankPlan
from .transport import Codec, LinkModel, LocalHub, ThreadTransport, get_codec


def simulate(part: Partition, kept: np.ndarray | None, x: Tensor, codec: str = "fp32",
             link: LinkModel | None = None, timeout: float = 30.0, records: list[dict[str, Tensor]] | None = None,
             ) -> tuple[Any, list[ThreadTransport]]:
    """The leader's gathered output and every node's transport (with its byte counters).

    With a list ``records``, it receives one dict per node: the node's local part of every value it computed."""
    kept = part.all_links() if kept is None else np.asarray(kept, dtype=bool)
    hub = LocalHub()
    results: dict[int, Any] = {}
    errors: list[BaseException] = []
    trs: list[ThreadTransport] = []
    execs = []
    for j, sch in enumerate(build(part, kept)):
        plan = RankPlan(part, kept, j, sch)
        weights, _ = plan.shard_from(part.gm)
        tr = ThreadTransport(hub, j, part.nodes, timeout=timeout, codec=codec, link=link, n_links=part.n_links,
                             values_per_link=part.links.values,
                             cdims={ex.tag: ex.cdim for ex in plan.exchanges.values()})
        trs.append(tr)
        execs.append(Executor(plan, part.gm, weights, tr))
        if records is not None:
            execs[-1].record = {}
            records.append(execs[-1].record)

    def work(j: int) -> None:
        try:
            results[j] = execs[j].run([x] if j == 0 else None)
        except BaseException as e:  # re-raised in the caller
            errors.append(e)

    threads = [threading.Thread(target=work, args=(j,), daemon=True) for j in range(part.nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    for tr in trs:
        tr.close()
    if errors:
        raise errors[0]
    return results[0], trs


class PerSample(Codec):
    """``codec`` applied to each sample of a batch on its own: a batch-B message costs and rounds
    exactly like B messages of batch 1 (what the runtime sends at its exported batch size of 1)."""

    def __init__(self, codec: Codec) -> None:
        self.inner, self.name, self.bytes_per_value = codec, codec.name, codec.bytes_per_value

    def _split(self, shape: tuple[int, ...], cdim: int) -> bool:
        return len(shape) > 1 and cdim != 0 and shape[0] > 1

    def nbytes(self, shape: tuple[int, ...], cdim: int) -> int:
        if not self._split(shape, cdim):
            return self.inner.nbytes(shape, cdim)
        return shape[0] * self.inner.nbytes(tuple(shape[1:]), cdim - 1)

    def encode(self, t: Tensor, cdim: int) -> Tensor:
        if not self._split(tuple(t.shape), cdim):
            return self.inner.encode(t, cdim)
        return torch.cat([self.inner.encode(t[b], cdim - 1) for b in range(t.shape[0])])

    def decode(self, buf: Tensor, shape: tuple[int, ...], cdim: int) -> Tensor:
        if not self._split(shape, cdim):
            return self.inner.decode(buf, shape, cdim)
        k = self.inner.nbytes(tuple(shape[1:]), cdim - 1)
        return torch.stack([self.inner.decode(buf[b * k:(b + 1) * k], tuple(shape[1:]), cdim - 1)
                            for b in range(shape[0])])


class SplitModel(nn.Module):
    """A DISCO model evaluated through its node plans: N executors as threads of this process, the
    wire ``codec`` applied at every exchange as the runtime applies it (per sample, see
    :class:`PerSample`). The partition and plans are built once per input shape (the plans have
    static shapes); every one must have the links of ``part`` (same graph and ownership).
    ``model`` is the plain model (not a :class:`~disco.masks.DiscoModel`): the shards take only the
    weight columns the kept links allow, so the masks need not be applied."""

    def __init__(self, model: nn.Module, part: Partition, kept: np.ndarray, codec: str = "fp32",
                 timeout: float = 120.0) -> None:
        super().__init__()
        self.model, self.part, self.kept, self.timeout = model, part, np.asarray(kept, dtype=bool), timeout
        self.codec = PerSample(get_codec(codec))
        self._plans: dict[tuple[int, ...], tuple[Partition, list[Any]]] = {}

    def _plans_for(self, shape: tuple[int, ...]) -> tuple[Partition, list[Any]]:
        if shape not in self._plans:
            from ..graph import partition

            part = partition(self.model, shape, self.part.nodes, self.part.shares)
            ref = self.part.links
            if part.n_links != self.part.n_links or not all(
                    np.array_equal(getattr(part.links, f), getattr(ref, f)) for f in ("tensor", "receiver", "channel")):
                raise ValueError(f"the partition at input shape {shape} has other links than at "
                                 f"{self.part.input_shape}; the kept set does not transfer")
            plans = []
            for j, sch in enumerate(build(part, self.kept)):
                plan = RankPlan(part, self.kept, j, sch)
                plans.append((plan, plan.shard_from(part.gm)[0]))
            self._plans[shape] = (part, plans)
        return self._plans[shape]

    @torch.no_grad()
    def forward(self, x: Tensor) -> Any:
        part, plans = self._plans_for(tuple(x.shape))
        hub = LocalHub()
        results: dict[int, Any] = {}
        errors: list[BaseException] = []

        def work(j: int) -> None:
            plan, weights = plans[j]
            tr = ThreadTransport(hub, j, part.nodes, timeout=self.timeout, codec=self.codec,
                                 cdims={ex.tag: ex.cdim for ex in plan.exchanges.values()})
            try:
                results[j] = Executor(plan, part.gm, weights, tr).run([x] if j == 0 else None)
            except BaseException as e:  # re-raised in the caller
                errors.append(e)
            finally:
                tr.close()

        threads = [threading.Thread(target=work, args=(j,), daemon=True) for j in range(1, part.nodes)]
        for t in threads:
            t.start()
        work(0)
        for t in threads:
            t.join(self.timeout + 5)
        if errors:
            raise errors[0]
        return results[0]
