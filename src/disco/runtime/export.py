"""Export a DISCO model as one weight shard per node plus a manifest, and load one node's part back.

Layout of an export directory::

    manifest.json            format, version, model config and hash, nodes, input shape,
                             ownership fingerprint, kept links (bit-packed), dtype, codec,
                             per-node parameter counts and shard checksums, the reference's
                             checksum, and ``manifest_hash`` over all of these
    node{j}.schedule.json    node j's steps (:mod:`disco.schedule`), its sha256 in the manifest
    node{j}.safetensors      node j's weights only; its header repeats the identity
                             (model hash, nodes, rank, fingerprint), a tensor checksum, the
                             manifest hash and one digest per manifest field
    reference.safetensors    a probe input and the single-process DISCO model's output on it

Verification before any compute (:func:`load_node`): the manifest's fields are all there and
name nothing outside the export folder; each field's digest matches the one the shard recorded
at export (an edited field is refused by name); the manifest hash matches; the shard's tensors
match both its header's and the manifest's checksum. Then a node rebuilds the architecture on
the ``meta`` device (no weight memory), re-derives the partition and its own plan from the
manifest, checks the shard's shapes against them and keeps only its own tensors.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, fx, nn

from ..checkpoint import pack_bits, state_digest, unpack_bits
from ..errors import RefusedError, ShardError
from ..graph import Partition, partition
from ..schedule import RankSchedule, build
from .plan import RankPlan
from .proof import SPREAD_THRESHOLD, constant_output_proof, output_spread, proof_summary

log = logging.getLogger(__name__)

FORMAT = "disco-shards"
VERSION = 3  # 2: manifest hash and per-field digests in every shard header; 3: the schedules

# every field a node reads; ``info`` (free-form notes) and ``manifest_hash`` itself are not hashed
REQUIRED = ("format", "version", "model", "model_hash", "nodes", "input_shape", "fingerprint", "n_links", "kept",
            "ratio", "codec", "params_dense", "bytes_predicted", "shards", "manifest_hash", "reference_sha256",
            "schedules")
UNHASHED = ("manifest_hash", "info")
# model config keys that could make a node read a file (a manifest names no file outside its folder)
_FILE_KEYS = re.compile(r"weight|pretrain|checkpoint|ckpt|path|file|url|dir|backbone", re.I)


ExportProofError = RefusedError  # the split does not compute the model's own function: nothing is written

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
    from ..cost import estimate
    from .transport import get_codec

    get_codec(codec)
    kept = part.all_links() if kept is None else np.asarray(kept, dtype=bool)
    if probe is None:
        g = torch.Generator().manual_seed(0)
        probe = torch.randn(part.input_shape, generator=g)
    ref, proof = prove(model, part, kept, probe)  # before anything is written
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gm = part.gm
    mhash = model_hash(gm, part)
    fp = part.fingerprint()
    rep = estimate(part, kept)
    check_model_spec(model_spec, "model_spec")
    states, shards, schedules = [], [], []
    for j, sch in enumerate(build(part, kept)):
        plan = RankPlan(part, kept, j, sch)
        schedules.append(write_schedule(out / f"node{j}.schedule.json", sch))
        state, n_params = plan.shard_from(gm)
        if n_params != rep.params_per_node[j]:
            raise RuntimeError(f"shard of rank {j} holds {n_params} parameters, the cost model counts "
                               f"{rep.params_per_node[j]} (accounting mismatch)")
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        states.append(state)
        shards.append({"file": f"node{j}.safetensors", "rank": j, "params": n_params, "bytes": nbytes,
                       "sha256": state_digest(state)})
    _write(out / "reference.safetensors", {"input": probe.contiguous(), **ref})
    manifest = {
        "format": FORMAT, "version": VERSION, "model": model_spec, "model_hash": mhash, "nodes": part.nodes,
        "shares": list(part.shares) if part.shares else None,
        "placement": "receiver" if part.relay else "sender",
        "input_shape": list(part.input_shape), "input_dtype": "float32", "fingerprint": fp,
        "n_links": part.n_links, "kept": pack_bits(kept), "ratio": part.ratio(kept), "dtype": "float32",
        "codec": codec, "params_dense": rep.params_dense, "bytes_predicted": rep.bytes,
        "input_bytes": rep.input_bytes, "output_bytes": rep.output_bytes, "stats_bytes": rep.stats_bytes,
        "shards": shards, "schedules": schedules, "reference_sha256": file_sha256(out / "reference.safetensors"),
        "info": info or {}, "task": (info or {}).get("task"), "proof": proof,
        "preprocess": (info or {}).get("preprocess"),  # size, mean, std, scale, labels: what a client feeds
        "shape_guards": list(part.shape_guards),  # branches on the input's shape resolved for input_shape
    }
    fields = field_digests(manifest)
    manifest["manifest_hash"] = manifest_hash(fields)
    for j, state in enumerate(states):
        header = {"format": FORMAT, "version": VERSION, "model_hash": mhash, "nodes": part.nodes, "rank": j,
                  "fingerprint": fp, "sha256": shards[j]["sha256"], "params": shards[j]["params"],
                  "manifest_hash": manifest["manifest_hash"], "manifest_fields": fields}
        _write(out / shards[j]["file"], state, {"disco_shard": json.dumps(header)})
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(out / "manifest.json")
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
    """The reference outputs of :func:`prove` (the split proved, else :class:`ExportProofError`)."""
    return prove(model, part, kept, probe, tol)[0]


def prove(model: nn.Module, part: Partition, kept: np.ndarray, probe: Tensor,
          tol: float = PROOF_TOLERANCE) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Run the N node plans (threads of this process) on ``probe`` and compare their gathered output with
    the model's own forward (masked by ``kept``, never our graph of it). Returns the reference outputs
    (:func:`reference_outputs`) and what the proof compared (:func:`~disco.runtime.proof.proof_summary`);
    raises :class:`ExportProofError` naming the first op whose output parts from the model's when the
    relative error exceeds ``tol``. Where the output does not depend on the input (a zero head), the last
    non-constant tensors are compared instead (:mod:`disco.runtime.proof`)."""
    from .local import simulate

    with _masked(model, part, kept) as m, torch.no_grad():
        ref = reference_outputs(m(probe))
        out_spread = output_spread(m, probe, ref)
        out, _ = simulate(part, kept, probe, timeout=600.0)
        err = _output_error(out, ref, out_spread)
        if err <= tol:
            if out_spread < SPREAD_THRESHOLD:
                return ref, constant_output_proof(m, part, kept, probe, out_spread, tol)
            log.info("split proved against the model's own forward: max rel. error %.2e", err)
            return ref, proof_summary(out_spread, None, err)
        graph_err = compare_reference(part.gm(probe), ref)
        if graph_err > tol:
            where = (f"the captured graph itself differs from the model's forward (rel. error {graph_err:.2e}): "
                     "the forward has behaviour that torch.fx did not record")
        else:
            where = _first_divergence(part, kept, probe, tol)
    raise ExportProofError(f"refusing to export: the split differs from the model's own forward on the probe "
                           f"input (max rel. error {err:.2e} > {tol:g}); {where}")


def _output_error(out: Any, ref: dict[str, Tensor], out_spread: float) -> float:
    """The output's relative error; against a constant output (which proves nothing by itself) relative to
    max(|ref|, 1), so that an all-zero reference is no 0/0 (a constant output that differs still fails)."""
    if out_spread >= SPREAD_THRESHOLD:
        return compare_reference(out, ref)
    floor = {k: v.abs().max().clamp_min(1.0) for k, v in ref.items()}
    got = reference_outputs(out)
    return max(float((got[k] - ref[k]).abs().max() / floor[k]) for k in ref)


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
    plans = [RankPlan(part, kept, j) for j in range(part.nodes)]
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


def write_schedule(path: Path, sch: RankSchedule) -> dict[str, str]:
    """Write one rank's schedule as JSON; returns its manifest entry (file name, sha256)."""
    path.write_text(json.dumps(sch.to_json(), separators=(",", ":")))
    return {"file": path.name, "sha256": file_sha256(path)}


def read_schedule(d: Path, man: dict[str, Any], rank: int) -> RankSchedule:
    """Rank ``rank``'s schedule file, refused when its sha256 differs from the manifest's."""
    entry = man["schedules"][rank] if isinstance(man["schedules"], list) and len(man["schedules"]) > rank else None
    name = f"node{rank}.schedule.json"
    if not isinstance(entry, dict) or entry.get("file") != name:
        raise ShardError(f"{d / 'manifest.json'}: field 'schedules[{rank}]' must be "
                         f"{{'file': '{name}', 'sha256': ...}}")
    path = d / name
    if not path.is_file() or file_sha256(path) != entry.get("sha256"):
        raise ShardError(f"schedule {path} is missing or does not match its sha256 in the manifest")
    try:
        return RankSchedule.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as e:
        raise ShardError(f"schedule {path} is damaged: {e}") from e


def _write(path: Path, state: dict[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata=metadata)
    tmp.replace(path)


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def field_digests(man: dict[str, Any]) -> dict[str, str]:
    """One digest per manifest field (all but ``info`` and ``manifest_hash``), over its canonical JSON."""
    return {k: hashlib.sha256(json.dumps(v, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]
            for k, v in sorted(man.items()) if k not in UNHASHED}


def manifest_hash(fields: dict[str, str]) -> str:
    """The manifest hash: over the per-field digests (so every field that matters is in it)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


def check_model_spec(spec: Any, where: str) -> None:
    """Refuse a model config that could make a node read a file: a manifest names no file outside its folder,
    and a node's weights are its shard only."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ShardError(f"{where}: field 'model' must be {{'name': ..., 'kwargs': {{...}}}}, got {spec!r:.80}")
    kwargs = spec.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise ShardError(f"{where}: field 'model.kwargs' must be an object, got {type(kwargs).__name__}")
    for k, v in kwargs.items():
        if _FILE_KEYS.search(k) and v is not None:  # weights=None, weights_backbone=None: no file, accepted
            raise ShardError(f"{where}: field 'model.kwargs.{k}' is refused: a node's weights are its shard only "
                             "(a manifest names no file)")
        scalars = (v,) if not isinstance(v, (list, tuple)) else tuple(v)
        for x in scalars:
            if not (x is None or isinstance(x, (bool, int, float))
                    or (isinstance(x, str) and len(x) < 64 and not re.search(r"[/\\~]|\.\.", x))):
                raise ShardError(f"{where}: field 'model.kwargs.{k}' = {x!r:.60} is refused: model options are "
                                 "numbers, flags or short names, never paths")


def read_manifest(d: str | Path) -> dict[str, Any]:
    """Read ``d/manifest.json`` and refuse it (:class:`ShardError`, naming the field) when a field is missing,
    of the wrong kind, or names a file outside ``d`` (the hash is checked against a shard by :func:`load_node`)."""
    p = Path(d) / "manifest.json"
    if not p.is_file():
        raise ShardError(f"{d} has no manifest.json (not an export directory; run `disco export` first)")
    try:
        m = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardError(f"{p} is damaged: {e}") from e
    if not isinstance(m, dict):
        raise ShardError(f"{p} is damaged: not a JSON object")
    if m.get("format") != FORMAT or m.get("version") != VERSION:
        raise ShardError(f"{p}: format {m.get('format')!r} v{m.get('version')}, expected {FORMAT!r} v{VERSION}"
                         + (" (an older export: export it again)" if m.get("format") == FORMAT else ""))
    missing = [k for k in REQUIRED if k not in m]
    if missing:
        raise ShardError(f"{p}: field{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} missing")
    check_model_spec(m["model"], str(p))
    if not isinstance(m["nodes"], int) or isinstance(m["nodes"], bool) or m["nodes"] < 1:
        raise ShardError(f"{p}: field 'nodes' must be a positive integer, got {m['nodes']!r}")
    shards = m["shards"]
    if not isinstance(shards, list) or len(shards) != m["nodes"]:
        raise ShardError(f"{p}: field 'shards' must list {m['nodes']} shards")
    for j, sh in enumerate(shards):
        if not isinstance(sh, dict) or sh.get("rank") != j or sh.get("file") != f"node{j}.safetensors" \
                or not isinstance(sh.get("sha256"), str):
            raise ShardError(f"{p}: field 'shards[{j}]' must be {{'file': 'node{j}.safetensors', 'rank': {j}, "
                             f"'sha256': ...}} (a manifest names no file outside its folder), got {sh!r:.100}")
    return m


def _check_fields(man: dict[str, Any], header: dict[str, Any], d: Path, path: Path) -> None:
    """Name the manifest fields that differ from what the shard recorded at export."""
    rec = header.get("manifest_fields")
    if not isinstance(rec, dict):
        raise ShardError(f"shard {path} has no record of its manifest (an older export: export it again)")
    now = field_digests(man)
    edited = sorted(k for k in set(rec) | set(now) if rec.get(k) != now.get(k))
    if edited:
        raise ShardError(f"{d / 'manifest.json'}: field{'s' if len(edited) > 1 else ''} "
                         f"{', '.join(map(repr, edited))} edited after export (the shards recorded other values)")
    if manifest_hash(now) != man["manifest_hash"] or header.get("manifest_hash") != man["manifest_hash"]:
        raise ShardError(f"{d / 'manifest.json'}: field 'manifest_hash' edited after export "
                         "(the shards recorded another)")


@dataclass
class NodeState:
    """What one node holds: its plan, the meta-device graph and its own weights."""

    manifest: dict[str, Any]
    part: Partition
    plan: RankPlan
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
    check_model_spec(spec, "manifest")
    shape, nodes = manifest["input_shape"], int(manifest["nodes"])
    try:
        with torch.device("meta"):
            model = build_model(spec["name"], **spec.get("kwargs", {}))
        return partition(model, torch.zeros(shape, device="meta"), nodes, manifest.get("shares"),
                         relay=manifest.get("placement") == "receiver")
    except (RuntimeError, NotImplementedError) as e:
        log.info("%s cannot be built on the meta device (%s); building it on the CPU", spec["name"],
                 str(e).splitlines()[0] if str(e) else type(e).__name__)
    model = build_model(spec["name"], **spec.get("kwargs", {}))
    part = partition(model, torch.zeros(shape), nodes, manifest.get("shares"),
                     relay=manifest.get("placement") == "receiver")
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
            _check_fields(man, header, d, path)
            weights = {k: f.get_tensor(k) for k in f.keys()}
    except ShardError:
        raise
    except Exception as e:
        raise ShardError(f"shard {path} is damaged: {type(e).__name__}: {e}") from e
    digest = state_digest(weights)
    if digest != header["sha256"]:
        raise ShardError(f"shard {path} is damaged: tensor checksum does not match its header")
    if digest != man["shards"][rank]["sha256"]:
        raise ShardError(f"{d / 'manifest.json'}: field 'shards[{rank}].sha256' does not match {path.name}")
    part = meta_partition(man)
    if part.fingerprint() != man["fingerprint"]:
        raise ShardError(f"{d}: ownership fingerprint {man['fingerprint']} does not match the partition of "
                         f"{man['model']['name']} for {man['nodes']} nodes ({part.fingerprint()})")
    kept = unpack_bits(man["kept"], man["n_links"])
    sch = read_schedule(d, man, rank)
    if sch != build(part, kept)[rank]:
        raise ShardError(f"schedule node{rank}.schedule.json in {d} is not the schedule of rank {rank} for this "
                         "partition and these kept links (exported by another version: export it again)")
    plan = RankPlan(part, kept, rank, sch)
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
