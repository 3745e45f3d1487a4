"""The one liveness walk over a partitioned graph: where each value is computed, when it is last
used, and until when the channels a rank received for it must stay. The cost model's peak memory
and the executor's frees both read it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import fx

from .types import Partition


@dataclass
class Liveness:
    """Positions in graph order, by fx node name."""

    order: dict[str, int]  # where each value is computed
    last_use: dict[str, int]  # its last user (itself when it has none)
    received_until: dict[str, int]  # base tensor -> the last mixing op that reads links of it
    views_until: dict[str, int]  # value -> the last mixing op whose received view is built through it


def liveness(part: Partition) -> Liveness:
    """Walk ``part``'s graph once and return its :class:`Liveness`."""
    nodes: list[fx.Node] = list(part.gm.graph.nodes)
    order = {nd.name: k for k, nd in enumerate(nodes)}
    last_use = {nd.name: max((order[u.name] for u in nd.users), default=order[nd.name]) for nd in nodes}
    for name, (src, _) in part.gathers.items():  # a gather reads its source, maybe past a chunk node
        last_use[src] = max(last_use[src], order[name])
    by_name = {nd.name: nd for nd in nodes}
    received_until: dict[str, int] = {}
    views_until: dict[str, int] = {}
    for ly in part.layers:
        at = order[ly.node]
        for t in {part.link_tensors[t] for t in part.links.tensor[np.unique(ly.col_link[ly.col_link >= 0])]}:
            received_until[t] = max(received_until.get(t, 0), at)
        # received views are built lazily by the mixing op that reads them: every value on the view
        # chain to its input stays alive until it has run
        stack = [ly.input]
        while stack:
            name = stack.pop()
            views_until[name] = max(views_until.get(name, 0), at)
            rule = part.rules.get(name)
            if name in part.gathers:
                stack.append(part.gathers[name][0])
            elif name in part.relayed:  # applied by the receiver: its static arguments too (a size)
                stack += [a.name for a in by_name[name].all_input_nodes]
            elif rule is not None and rule.kind == "view":
                stack += [a.name for a in by_name[name].all_input_nodes if part.owner.get(a.name) is not None]
    return Liveness(order, last_use, received_until, views_until)
