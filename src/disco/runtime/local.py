"""Run all N node programs as threads of one process (fast checks of the plans, no sockets)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from torch import Tensor

from ..graph import Partition
from .executor import Executor
from .plan import NodePlan
from .transport import LinkModel, LocalHub, ThreadTransport


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
    for j in range(part.nodes):
        plan = NodePlan(part, kept, j)
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
