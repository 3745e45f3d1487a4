"""Export a DISCO model as one weight shard per node plus a manifest, and load one node's part back.

Layout of an export directory::

    manifest.json            format, version, model config and hash, nodes, input shape,
                             ownership fingerprint, kept links (bit-packed), dtype, codec,
                             per-node parameter counts and shard checksums
    node{j}.safetensors      node j's weights only; its header repeats the identity
                             (model hash, nodes, rank, fingerprint) and a tensor checksum
    reference.safetensors    a probe input and the single-process DISCO model's output on it

A node rebuilds the architecture on the ``meta`` device (no weight memory), re-derives
the partition and its own plan from the manifest, checks the shard against them and
loads only its own tensors.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, fx, nn

from ..checkpoint import pack_bits, state_digest, unpack_bits
from ..graph import Partition, partition
from .plan import NodePlan

log = logging.getLogger(__name__)

FORMAT = "disco-shards"
VERSION = 1



class ShardError(ValueError):
    """A shard or manifest that does not belong to this run (other model, N, rank) or is damaged."""


class ExportProofError(ValueError):
    """The node plans do not compute the model's own function on the probe input: nothing is written."""


PROOF_TOLERANCE = 1e-4  # largest relative error of the split against the model's own forward




def model_hash(gm: nn.Module, part: Partition) -> str:
    """A hash of the weights the partitioned model computes with (masks applied)."""
    h = hashlib.sha256()
    for ly in part.layers:  # masked weights of the mixing layers
        h.update(ly.key.encode())
        w = ly.view(gm).weight.detach().contiguous()
        h.update(w.reshape(-1).view(torch.uint8).numpy().tobytes())
    mixing = {f"{ly.name}.{ly.param}" for ly in part.layers}
    for k, v in sorted(gm.state_dict().items()):
        if k in mixing or ".parametrizations." in k:  # hashed above (masked), or masks
            continue
        h.update(k.encode())
        h.update(v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def reference_outputs(out: Any) -> dict[str, Tensor]:
    """The model output as named tensors for reference.safetensors: ``output`` for one tensor, else
    ``output.0``, ``output.1``, ... in pytree order (a detector's per-level head outputs)."""
    if isinstance(out, Tensor):
        return {"output": out.detach().contiguous()}
    leaves = torch.utils._pytree.tree_leaves(out)
    if not leaves or not all(isinstance(t, Tensor) for t in leaves):
        raise TypeError(f"model output {type(out).__name__} holds non-tensor leaves; cannot store a reference")
    return {f"output.{i}": t.detach().contiguous() for i, t in enumerate(leaves)}


def compare_reference(out: Any, ref: dict[str, Tensor]) -> float:
    """Largest relative error (max |a-b| / max |b|) of ``out`` against :func:`reference_outputs` tensors."""
    got = reference_outputs(out)
    if got.keys() != ref.keys():
        raise ValueError(f"output has tensors {sorted(got)}, the reference {sorted(ref)}")
    return max(float((got[k] - ref[k]).abs().max() / ref[k].abs().max().clamp_min(1e-30)) for k in ref)


def export(model: nn.Module, part: Partition, kept: np.ndarray | None, out_dir: str | Path,
           model_spec: dict[str, Any], codec: str = "fp32", probe: Tensor | None = None,
           info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write node shards + manifest for ``model`` partitioned by ``part`` with links ``kept``.

    ``model`` may be a :class:`disco.masks.DiscoModel`-wrapped model or a plain one (the kept
    links decide which weight columns are written either way). ``model_spec`` is the
    ``{"name", "kwargs"}`` config that rebuilds the architecture. Returns the manifest.
    """
    from safetensors.torch import save_file

    from ..cost import estimate
    from .transport import get_codec

    get_codec(codec)
    kept = part.all_links() if kept is None else np.asarray(kept, dtype=bool)
    if probe is None:
        g = torch.Generator().manual_seed(0)
        probe = torch.randn(part.input_shape, generator=g)
    ref = prove_split(model, part, kept, probe)  # before anything is written
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gm = part.gm
    mhash = model_hash(gm, part)
    fp = part.fingerprint()
    rep = estimate(part, kept)
    shards = []
    for j in range(part.nodes):
        plan = NodePlan(part, kept, j)
        state, n_params = plan.shard_from(gm)
        if n_params != rep.params_per_node[j]:
            raise RuntimeError(f"shard of rank {j} holds {n_params} parameters, the cost model counts "
                               f"{rep.params_per_node[j]} (accounting mismatch)")
        digest = state_digest(state)
        header = {"format": FORMAT, "version": VERSION, "model_hash": mhash, "nodes": part.nodes, "rank": j,
                  "fingerprint": fp, "sha256": digest, "params": n_params}
        path = out / f"node{j}.safetensors"
        tmp = path.with_name(path.name + ".tmp")
        save_file(state, str(tmp), metadata={"disco_shard": json.dumps(header)})
        tmp.replace(path)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        shards.append({"file": path.name, "rank": j, "params": n_params, "bytes": nbytes, "sha256": digest})
    save_file({"input": probe.contiguous(), **ref}, str(out / "reference.safetensors"))
    manifest = {
        "format": FORMAT, "version": VERSION, "model": model_spec, "model_hash": mhash, "nodes": part.nodes,
        "shares": list(part.shares) if part.shares else None,
        "input_shape": list(part.input_shape), "input_dtype": "float32", "fingerprint": fp,
        "n_links": part.n_links, "kept": pack_bits(kept), "ratio": part.ratio(kept), "dtype": "float32",
        "codec": codec, "params_dense": rep.params_dense, "bytes_predicted": rep.bytes,
        "input_bytes": rep.input_bytes, "output_bytes": rep.output_bytes, "stats_bytes": rep.stats_bytes,
        "shards": shards, "info": info or {},
        "task": (info or {}).get("task"),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    log.info("exported %d shards to %s (params per node %s)", part.nodes, out, [s["params"] for s in shards])
    return manifest


@contextlib.contextmanager
def _masked(model: nn.Module, part: Partition, kept: np.ndarray) -> Iterator[nn.Module]:
    """``model`` in eval mode computing the DISCO function of ``kept`` with its own forward: a
    :class:`~disco.masks.DiscoModel` with its links set to ``kept``, or a plain model wrapped in place
    with the masks for the duration (removed afterwards; a plain model with every link kept is itself)."""
    from torch.nn.utils import parametrize

    from ..masks import DiscoModel

    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        if isinstance(model, DiscoModel):
            old = model.kept.copy()
            model.set_kept(kept)
            try:
                yield model
            finally:
                model.set_kept(old)
        elif kept.all():
            yield model
        else:
            dm = DiscoModel(model, part, kept)
            try:
                yield dm
            finally:
                for ly in part.layers:
                    parametrize.remove_parametrizations(model.get_submodule(ly.name), ly.param,
                                                        leave_parametrized=False)
    finally:
        for m, mode in modes:
            m.training = mode


def prove_split(model: nn.Module, part: Partition, kept: np.ndarray, probe: Tensor,
                tol: float = PROOF_TOLERANCE) -> dict[str, Tensor]:
    """Run the N node plans (threads of this process) on ``probe`` and compare their gathered output with
    the model's own forward (masked by ``kept``, never our graph of it). Returns the reference outputs
    (:func:`reference_outputs`); raises :class:`ExportProofError` naming the first op whose output parts
    from the model's when the relative error exceeds ``tol``."""
    from .local import simulate

    with _masked(model, part, kept) as m, torch.no_grad():
        ref = reference_outputs(m(probe))
        out, _ = simulate(part, kept, probe, timeout=600.0)
        err = compare_reference(out, ref)
        if err <= tol:
            log.info("split proved against the model's own forward: max rel. error %.2e", err)
            return ref
        graph_err = compare_reference(part.gm(probe), ref)
        if graph_err > tol:
            where = (f"the captured graph itself differs from the model's forward (rel. error {graph_err:.2e}): "
                     "the forward has behaviour that torch.fx did not record")
        else:
            where = _first_divergence(part, kept, probe, tol)
    raise ExportProofError(f"refusing to export: the split differs from the model's own forward on the probe "
                           f"input (max rel. error {err:.2e} > {tol:g}); {where}")


def _first_divergence(part: Partition, kept: np.ndarray, probe: Tensor, tol: float) -> str:
    """The first op (graph order) whose output assembled from the nodes differs from the single-process graph."""
    from ..graph.partition import describe
    from .local import simulate

    values: dict[str, Any] = {}

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:  # noqa: D102
            v = super().run_node(n)
            values[n.name] = v
            return v

    _Recorder(part.gm).run(probe)
    records: list[dict[str, Tensor]] = []
    simulate(part, kept, probe, timeout=600.0, records=records)
    plans = [NodePlan(part, kept, j) for j in range(part.nodes)]
    for nd in part.gm.graph.nodes:
        ref = values.get(nd.name)
        if part.owner.get(nd.name) is None or not isinstance(ref, Tensor) or not ref.is_floating_point():
            continue
        cdim = part.cdim[nd.name]
        full = torch.zeros_like(ref)
        for j, rec in enumerate(records):
            if nd.name in rec:
                full.index_copy_(cdim, torch.as_tensor(plans[j].local[nd.name]), rec[nd.name])
        err = float((full - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
        if err > tol:
            return f"first difference at {describe(nd, part.gm)} (rel. error {err:.2e})"
    return "no single op's output differs (the difference is in gathering the output)"


def export_checkpoint(ckpt_path: str | Path, out_dir: str | Path, codec: str = "fp32") -> dict[str, Any]:
    """Export a sparsified DISCO checkpoint (one with ``disco`` metadata: nodes, kept links)."""
    from ..loading import load

    loaded = load(ckpt_path)  # checks format, checksum and the partition fingerprint
    if loaded.partition is None:
        raise ShardError(f"{ckpt_path} is a dense checkpoint (no DISCO nodes/kept links); sparsify it first, "
                         "or export a dense split with export(model, partition, None, ...)")
    return export(loaded.model, loaded.partition, loaded.model.kept, out_dir, loaded.ckpt.model, codec=codec,
                  info={"checkpoint": str(ckpt_path), "metrics": loaded.ckpt.info.get("metrics", {}),
                        "task": loaded.ckpt.task})


def read_manifest(d: str | Path) -> dict[str, Any]:
    p = Path(d) / "manifest.json"
    if not p.is_file():
        raise ShardError(f"{d} has no manifest.json (not an export directory; run `disco export` first)")
    try:
        m = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ShardError(f"{p} is damaged: {e}") from e
    if m.get("format") != FORMAT or m.get("version") != VERSION:
        raise ShardError(f"{p}: format {m.get('format')!r} v{m.get('version')}, expected {FORMAT!r} v{VERSION}")
    return m


@dataclass
class NodeState:
    """What one node holds: its plan, the meta-device graph and its own weights."""

    manifest: dict[str, Any]
    part: Partition
    plan: NodePlan
    gm: fx.GraphModule
    weights: dict[str, Tensor]
    weight_bytes: int


def meta_partition(manifest: dict[str, Any]) -> Partition:
    """Rebuild the architecture on the meta device and partition it (no weight memory).

    A constructor that needs real tensors (torchvision's RegNet calls ``.tolist()``) fails on the meta
    device; the architecture is then built on the CPU with random weights (which are dropped: the node
    loads its shard) and partitioned on a CPU input of the same shape."""
    from ..models import build_model

    spec = manifest["model"]
    shape, nodes = manifest["input_shape"], int(manifest["nodes"])
    try:
        with torch.device("meta"):
            model = build_model(spec["name"], **spec.get("kwargs", {}))
        return partition(model, torch.zeros(shape, device="meta"), nodes, manifest.get("shares"))
    except (RuntimeError, NotImplementedError) as e:
        log.info("%s cannot be built on the meta device (%s); building it on the CPU", spec["name"],
                 str(e).splitlines()[0] if str(e) else type(e).__name__)
    model = build_model(spec["name"], **spec.get("kwargs", {}))
    part = partition(model, torch.zeros(shape), nodes, manifest.get("shares"))
    model.to("meta")  # the graph shares these modules: drop the random weights, as on the meta path
    return part


def load_node(d: str | Path, rank: int, nodes: int | None = None) -> NodeState:
    """Load node ``rank``'s shard from export directory ``d``, refusing anything that does not fit."""
    from safetensors import safe_open

    d = Path(d)
    man = read_manifest(d)
    if nodes is not None and nodes != man["nodes"]:
        raise ShardError(f"{d} was exported for {man['nodes']} nodes, this run has {nodes}")
    if not 0 <= rank < man["nodes"]:
        raise ShardError(f"rank {rank} is outside 0..{man['nodes'] - 1}")
    path = d / f"node{rank}.safetensors"
    if not path.is_file():
        raise ShardError(f"shard {path} is missing")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("disco_shard")
            header = json.loads(raw) if raw else None
            if header is None:
                raise ShardError(f"shard {path} is not a DISCO shard (no header)")
            _check_header(header, man, rank, path)
            weights = {k: f.get_tensor(k) for k in f.keys()}
    except ShardError:
        raise
    except Exception as e:
        raise ShardError(f"shard {path} is damaged: {type(e).__name__}: {e}") from e
    if state_digest(weights) != header["sha256"]:
        raise ShardError(f"shard {path} is damaged: tensor checksum does not match its header")
    part = meta_partition(man)
    if part.fingerprint() != man["fingerprint"]:
        raise ShardError(f"{d}: ownership fingerprint {man['fingerprint']} does not match the partition of "
                         f"{man['model']['name']} for {man['nodes']} nodes ({part.fingerprint()})")
    kept = unpack_bits(man["kept"], man["n_links"])
    plan = NodePlan(part, kept, rank)
    expected = plan.expected_shapes(part.gm)
    got = {k: tuple(v.shape) for k, v in weights.items()}
    if expected != got:
        diff = sorted(set(expected.items()) ^ set(got.items()))[:4]
        raise ShardError(f"shard {path} does not fit the plan of rank {rank} (first differences: {diff})")
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    return NodeState(man, part, plan, part.gm, weights, nbytes)


def _check_header(h: dict[str, Any], man: dict[str, Any], rank: int, path: Path) -> None:
    if h.get("format") != FORMAT or h.get("version") != VERSION:
        raise ShardError(f"shard {path}: format {h.get('format')!r} v{h.get('version')}, expected {FORMAT!r}")
    if h.get("nodes") != man["nodes"]:
        raise ShardError(f"shard {path} was exported for {h.get('nodes')} nodes, the manifest says {man['nodes']}")
    if h.get("rank") != rank:
        raise ShardError(f"shard {path} belongs to rank {h.get('rank')}, not rank {rank}")
    if h.get("model_hash") != man["model_hash"]:
        raise ShardError(f"shard {path} is from another model (model hash {h.get('model_hash')}, "
                         f"manifest says {man['model_hash']})")
    if h.get("fingerprint") != man["fingerprint"]:
        raise ShardError(f"shard {path} has ownership fingerprint {h.get('fingerprint')}, the manifest says "
                         f"{man['fingerprint']}")
