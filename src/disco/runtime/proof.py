"""What the export's proof compares: tensors that carry information about the input.

A model whose output does not depend on its input (a zero-initialised classifier head: torchvision's ViT,
timm's ``head_init_scale``) would pass any split: its reference output is the same whatever the split
computes. The *spread* of a tensor is how much it changes between two probe inputs, relative to its size
(:func:`spread`); below :data:`SPREAD_THRESHOLD` the tensor is *constant* and proves nothing.

Where the output is constant the network is first made informative for the proof only: its BatchNorm
statistics re-estimated on random inputs (:func:`recalibrated_bn`; a random-init network often goes constant a
few layers in), and where the output then varies the split is proved on it. Otherwise the proof compares the
deepest non-constant tensors of the model's own forward (forward hooks on its mixing layers, never our graph of
it): the inputs of the constant mixing layers at the end (the head's input) and the output of the last mixing
layer whose output is not constant; each assembled from every rank's part. Where nothing non-constant can be
compared the export is refused. The summary says how deep the compared tensors are (``depth``: mixing layer k
of L) and whether the statistics were recalibrated.
The manifest's ``proof`` field records what was compared and its spread (:func:`proof_summary`), and
``disco run`` reports no error against a constant reference (:func:`run_error`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
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


@contextlib.contextmanager
def recalibrated_bn(model: nn.Module, probe: Tensor, batches: int = 4, batch: int = 8) -> Iterator[bool]:
    """For the proof only: every BatchNorm's running statistics re-estimated on random inputs like ``probe`` (a
    random-init network whose statistics do not fit its activations goes constant a few layers in), restored on
    exit. Yields whether the model has any BatchNorm. The split reads the same modules (its graph shares them),
    so it computes with the same statistics; what the export writes is cut from the model after the restore."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    saved = [(m, m.momentum, {k: v.clone() for k, v in m._buffers.items() if v is not None}) for m in bns]
    was_training = model.training
    try:
        if bns:
            for m in bns:
                m.reset_running_stats()
                m.momentum = None  # a cumulative average over the batches
            g = torch.Generator().manual_seed(4321)
            std = float(probe.std()) if probe.numel() > 1 and float(probe.std()) > 0 else 1.0
            model.train()
            with torch.no_grad():
                for _ in range(batches):
                    model(torch.randn((batch, *probe.shape[1:]), generator=g, dtype=probe.dtype) * std + probe.mean())
            model.eval()
        yield bool(bns)
    finally:
        for m, momentum, bufs in saved:
            m.momentum = momentum
            for k, v in bufs.items():
                m._buffers[k].copy_(v)
        model.train(was_training)


def _depth(part: Partition, targets: list[Target]) -> dict[str, Any]:
    """How deep the deepest compared tensor is: its mixing layer's position among the model's mixing layers."""
    order = {ly.node: k for k, ly in enumerate(part.layers)}
    order.update({ly.input: k for k, ly in enumerate(part.layers) if ly.input not in order})
    k, t = max(((order.get(t.node, -1), t) for t in targets), key=lambda kt: kt[0])
    return {"layer": k + 1, "of": len(part.layers), "tensor": t.what}


def constant_output_proof(model: nn.Module, part: Partition, kept: np.ndarray, probe: Tensor, out_spread: float,
                          tol: float) -> dict[str, Any]:
    """The proof where the model's output is constant. First the network is made informative for the proof only
    (:func:`recalibrated_bn`): where its output then varies, the split is proved on the output; otherwise on the
    deepest tensors that vary, with or without the recalibration, whichever reaches deeper. Refuses
    (:class:`RefusedError`) when nothing varies, or when a compared tensor differs by more than ``tol``. The
    summary says which tensors were compared and how deep they are."""
    from .local import simulate

    with recalibrated_bn(model, probe) as has_bn:
        if has_bn:
            with torch.no_grad():
                ref = output_leaves(model(probe))
                spread_now = output_spread(model, probe, {str(k): t for k, t in enumerate(ref)})
            if spread_now >= SPREAD_THRESHOLD:
                out, _ = simulate(part, kept, probe, timeout=600.0)
                err = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                          for a, b in zip(output_leaves(out), ref, strict=True))
                if err > tol:
                    raise RefusedError(
                        f"refusing to export: the split differs from the model's own forward at its output (max rel. "
                        f"error {err:.2e} > {tol:g}), proved with BatchNorm statistics recalibrated on random inputs "
                        f"(the output with the model's own statistics is constant, spread {out_spread:.1e})")
                log.warning("the model's output does not depend on its input (spread %.1e): the split was proved on "
                            "its output with BatchNorm statistics recalibrated on random inputs (spread %.1e, max "
                            "rel. error %.2e)", out_spread, spread_now, err)
                summary = proof_summary(out_spread, [Target("output", "output", ref[0], spread_now, err)], err)
                summary.update(recalibrated_bn=True, depth={"layer": len(part.layers), "of": len(part.layers),
                                                            "tensor": "output"})
                return summary
            deep = informative_targets(model, part, probe)
            deep_err = prove_targets(part, kept, probe, deep) if deep else float("nan")
    plain = informative_targets(model, part, probe)
    if has_bn and deep and (not plain or _depth(part, deep)["layer"] > _depth(part, plain)["layer"]):
        targets, err, recal = deep, deep_err, True
    else:
        targets, recal = plain, False
        if not targets:
            raise RefusedError(
                f"refusing to export: the model's output does not depend on its input (spread {out_spread:.1e} "
                f"between two probe inputs, below {SPREAD_THRESHOLD:g}; e.g. a zero-initialised head) and no mixing "
                "layer before it has an input or output that does, even with its BatchNorm statistics recalibrated: "
                "nothing non-constant to prove the split on")
        err = prove_targets(part, kept, probe, targets)
    worst = max(targets, key=lambda t: t.err)
    how = " with BatchNorm statistics recalibrated on random inputs" if recal else ""
    if err > tol:
        raise RefusedError(f"refusing to export: the split differs from the model's own forward at the {worst.what} "
                           f"(node '{worst.node}', max rel. error {err:.2e} > {tol:g}){how}; the model's output is "
                           f"constant (spread {out_spread:.1e}), so it was compared there")
    depth = _depth(part, targets)
    log.warning("the model's output does not depend on its input (spread %.1e): the split was proved on %s%s, "
                "mixing layer %d of %d (max rel. error %.2e)", out_spread, ", ".join(t.what for t in targets), how,
                depth["layer"], depth["of"], err)
    summary = proof_summary(out_spread, targets, err)
    summary.update(recalibrated_bn=recal, depth=depth)
    return summary


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
