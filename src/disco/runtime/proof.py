"""What the export's proof compares: tensors that carry information about the input.

A model whose output does not depend on its input (a zero-initialised classifier head: torchvision's ViT,
timm's ``head_init_scale``) would pass any split: its reference output is the same whatever the split
computes. The *spread* of a tensor is how much it changes between two probe inputs, relative to its size
(:func:`spread`); below :data:`SPREAD_THRESHOLD` the tensor is *constant* and proves nothing.

Where the output is constant the proof compares instead the last non-constant tensors of the model's own
forward (forward hooks on its mixing layers, never our graph of it): the inputs of the constant mixing
layers at the end (the head's input) and the output of the last mixing layer whose output is not constant;
each assembled from every rank's part. Where nothing non-constant can be compared the export is refused.
The manifest's ``proof`` field records what was compared and its spread (:func:`proof_summary`), and
``disco run`` reports no error against a constant reference (:func:`run_error`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import RefusedError
from ..graph import Partition
from ..graph.types import REPLICATED

log = logging.getLogger(__name__)

SPREAD_THRESHOLD = 1e-4  # relative change between two probes below which a tensor proves nothing


def spread(a: Tensor, b: Tensor) -> float:
    """max |a - b| / max(|a|, |b|): how much a tensor changes between two probe inputs (0 for all zeros)."""
    a, b = a.detach().double(), b.detach().double()
    scale = float(torch.maximum(a.abs().max(), b.abs().max())) if a.numel() else 0.0
    return float((a - b).abs().max()) / scale if scale > 0 else 0.0


def output_leaves(out: Any) -> list[Tensor]:
    """The tensors of a model output (one tensor, or the leaves of a tuple/dict in pytree order)."""
    return [out] if isinstance(out, Tensor) else [t for t in torch.utils._pytree.tree_leaves(out)
                                                   if isinstance(t, Tensor)]


def second_probe(probe: Tensor) -> Tensor:
    """Another input like ``probe`` (same shape, mean and scale), from a fixed seed."""
    g = torch.Generator().manual_seed(12345)
    noise = torch.randn(probe.shape, generator=g, dtype=probe.dtype)
    std = float(probe.std()) if probe.numel() > 1 else 0.0
    return noise * (std if std > 0 else 1.0) + probe.mean()


def output_spread(model: Any, probe: Tensor, ref: dict[str, Tensor]) -> float:
    """How much ``model``'s output (reference tensors ``ref`` on ``probe``) changes on :func:`second_probe`: the
    largest :func:`spread` of its tensors (below :data:`SPREAD_THRESHOLD` the output proves nothing)."""
    other = output_leaves(model(second_probe(probe)))
    return max((spread(a, b) for a, b in zip(ref.values(), other, strict=True)), default=0.0)


@dataclass
class Target:
    """A tensor the proof compares: fx node ``node``'s value, as the model's own forward computed it."""

    node: str
    what: str  # 'output of <layer>' / 'input of <layer>'
    value: Tensor
    spread: float
    err: float = field(default=float("nan"))


def _hooked(model: nn.Module, part: Partition, x: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """{layer name: (input, output)} of every mixing layer called as a module, in ``model``'s own forward."""
    from ..masks import DiscoModel

    seen: dict[str, tuple[Tensor, Tensor]] = {}
    handles = []
    inner = model.model if isinstance(model, DiscoModel) else model
    nodes = {n.name: n for n in part.gm.graph.nodes}
    for ly in part.layers:
        nd = nodes[ly.node]
        if nd.op != "call_module" or nd.target != ly.name:
            continue

        def hook(m: nn.Module, args: tuple, out: Any, name: str = ly.name) -> None:
            if args and isinstance(args[0], Tensor) and isinstance(out, Tensor):
                seen[name] = (args[0].detach().clone(), out.detach().clone())

        handles.append(inner.get_submodule(ly.name).register_forward_hook(hook))
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def informative_targets(model: nn.Module, part: Partition, probe: Tensor, threshold: float = SPREAD_THRESHOLD
                        ) -> list[Target]:
    """The last non-constant tensors before a constant output (see the module docstring), or [] when none.

    ``model`` computes the DISCO function (masked) and is in eval mode; it runs on ``probe`` and a second probe."""
    a, b = _hooked(model, part, probe), _hooked(model, part, second_probe(probe))
    layers = [ly for ly in part.layers if ly.name in a and ly.name in b]
    out: list[Target] = []
    for ly in reversed(layers):
        (xi, yo), (xi2, yo2) = a[ly.name], b[ly.name]
        s_out = spread(yo, yo2)
        if s_out >= threshold:
            out.append(Target(ly.node, f"output of {ly.name}", yo, s_out))
            break
        s_in = spread(xi, xi2)
        split = part.owner.get(ly.input) is not None and bool((part.owner[ly.input] != REPLICATED).any())
        if s_in >= threshold and split and ly.input not in {t.node for t in out}:  # not the replicated image
            out.append(Target(ly.input, f"input of {ly.name}", xi, s_in))
    return out


def assemble(part: Partition, records: list[dict[str, Tensor]], plans: list[Any], name: str, like: Tensor
             ) -> Tensor:
    """Fx node ``name``'s full value from every rank's recorded local part (its local channels)."""
    cdim = part.cdim[name]
    full = torch.zeros_like(like)
    for j, rec in enumerate(records):
        if name in rec:
            full.index_copy_(cdim, torch.as_tensor(plans[j].local[name]), rec[name].to(like.dtype))
    return full


def prove_targets(part: Partition, kept: np.ndarray, probe: Tensor, targets: list[Target]) -> float:
    """Run the split once, recording every rank's values, and set each target's error against the model's own
    value (max |a - b| / max |b|). Returns the largest."""
    from .local import simulate
    from .plan import RankPlan

    records: list[dict[str, Tensor]] = []
    simulate(part, kept, probe, timeout=600.0, records=records)
    plans = [RankPlan(part, kept, j) for j in range(part.nodes)]
    for t in targets:
        got = assemble(part, records, plans, t.node, t.value)
        t.err = float((got - t.value).abs().max() / t.value.abs().max().clamp_min(1e-30))
    return max(t.err for t in targets)


def constant_output_proof(model: nn.Module, part: Partition, kept: np.ndarray, probe: Tensor, out_spread: float,
                          tol: float) -> dict[str, Any]:
    """The proof where the model's output is constant: compare the last non-constant tensors instead.
    Refuses (:class:`RefusedError`) when there is none, or when one differs by more than ``tol``."""
    targets = informative_targets(model, part, probe)
    if not targets:
        raise RefusedError(
            f"refusing to export: the model's output does not depend on its input (spread {out_spread:.1e} between "
            f"two probe inputs, below {SPREAD_THRESHOLD:g}; e.g. a zero-initialised head) and no mixing layer "
            "before it has an input or output that does: nothing non-constant to prove the split on")
    err = prove_targets(part, kept, probe, targets)
    worst = max(targets, key=lambda t: t.err)
    if err > tol:
        raise RefusedError(f"refusing to export: the split differs from the model's own forward at the {worst.what} "
                           f"(node '{worst.node}', max rel. error {err:.2e} > {tol:g}); the model's output is "
                           f"constant (spread {out_spread:.1e}), so it was compared there")
    log.warning("the model's output does not depend on its input (spread %.1e): the split was proved on %s "
                "(max rel. error %.2e)", out_spread, ", ".join(t.what for t in targets), err)
    return proof_summary(out_spread, targets, err)


def proof_summary(out_spread: float, targets: list[Target] | None, err: float) -> dict[str, Any]:
    """The manifest's ``proof`` field: what the proof compared, their spread and the largest error."""
    if not targets:
        return {"output_constant": False, "compared": ["output"], "spread": {"output": out_spread},
                "max_rel_err": err, "threshold": SPREAD_THRESHOLD}
    return {"output_constant": True, "output_spread": out_spread,
            "compared": [f"{t.what} (node {t.node})" for t in targets],
            "spread": {t.node: t.spread for t in targets}, "errors": {t.node: t.err for t in targets},
            "max_rel_err": err, "threshold": SPREAD_THRESHOLD}


def run_error(out: Any, ref: dict[str, Tensor], manifest: dict[str, Any]) -> float | None:
    """``disco run``'s error against the single-process reference, or None where the reference output is
    constant (the manifest's proof says so, or every reference value is the same): a constant output
    compares nothing, so no error is reported as a pass (the export proved the split on other tensors)."""
    proof = manifest.get("proof") or {}
    if proof.get("output_constant") or all(float(t.max() - t.min()) == 0.0 for t in ref.values()):
        return None
    leaves = output_leaves(out)
    got = {"output": leaves[0]} if isinstance(out, Tensor) else {f"output.{i}": t for i, t in enumerate(leaves)}
    if got.keys() != ref.keys():
        raise ValueError(f"output has tensors {sorted(got)}, the reference {sorted(ref)}")
    return max(float((got[k] - ref[k]).abs().max() / ref[k].abs().max().clamp_min(1e-30)) for k in ref)
