"""Rebuild models from checkpoints, with the checks that make a mismatch a clear error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from .checkpoint import Checkpoint, load_checkpoint, pack_bits, save_checkpoint
from .errors import RefusedError
from .graph import Partition, partition
from .masks import DiscoModel
from .models import build_model


@dataclass
class Loaded:
    ckpt: Checkpoint
    model: nn.Module  # the DiscoModel for a sparsified checkpoint, else the plain model
    partition: Partition | None


def _plain(ckpt: Checkpoint, path: Path) -> nn.Module:
    model = build_model(ckpt.model["name"], **ckpt.model.get("kwargs", {}))
    missing, unexpected = model.load_state_dict(ckpt.state_dict, strict=False)
    if missing or unexpected:
        raise RefusedError(f"{path}: weights do not fit model {ckpt.model['name']}: missing "
                              f"{list(missing)[:3]}, unexpected {list(unexpected)[:3]}")
    return model


def load(path: str | Path) -> Loaded:
    """Load a dense or DISCO checkpoint as a ready-to-run model (eval mode)."""
    path = Path(path)
    ckpt = load_checkpoint(path)
    model = _plain(ckpt, path)
    if ckpt.disco is None:
        return Loaded(ckpt, model.eval(), None)
    part = partition(model, tuple(ckpt.input_shape), ckpt.nodes, ckpt.disco.get("shares"),
                     relay=ckpt.disco.get("placement") == "receiver")  # checkpoints before it: sender
    _check_fingerprint(ckpt, part, path)
    return Loaded(ckpt, DiscoModel(model, part, ckpt.kept()).eval(), part)


def _check_fingerprint(ckpt: Checkpoint, part: Partition, path: Path) -> None:
    if part.n_links != ckpt.disco["n_links"] or part.fingerprint() != ckpt.disco["fingerprint"]:
        raise RefusedError(
            f"{path}: the partition of {ckpt.model['name']} for N={ckpt.nodes} differs from the one the checkpoint "
            "was made with (another disco version or model definition)")


def load_into(dm: DiscoModel, path: str | Path, model_name: str | None = None) -> Checkpoint:
    """Load a DISCO checkpoint into an existing DISCO model, refusing another model or N."""
    path = Path(path)
    ckpt = load_checkpoint(path)
    if model_name is not None and ckpt.model["name"] != model_name:
        raise RefusedError(f"{path} holds model {ckpt.model['name']!r}, not {model_name!r}")
    if ckpt.disco is None:
        raise RefusedError(f"{path} is a dense checkpoint; it has no kept links to load into a DISCO model")
    if ckpt.nodes != dm.partition.nodes:
        raise RefusedError(f"{path} is for N={ckpt.nodes} nodes; this model is split over N={dm.partition.nodes}")
    if tuple(ckpt.disco.get("shares") or ()) != tuple(dm.partition.shares or ()):
        raise RefusedError(f"{path} has node shares {ckpt.disco.get('shares')}; this model's are "
                              f"{dm.partition.shares}")
    _check_fingerprint(ckpt, dm.partition, path)
    plain = {k: v for k, v in ckpt.state_dict.items()}
    target = dm.plain_state_dict()
    if set(plain) != set(target) or any(plain[k].shape != target[k].shape for k in plain):
        raise RefusedError(f"{path}: weights do not fit this model ({ckpt.model['name']})")
    dm.set_kept(ckpt.kept())
    for ly in dm.partition.layers:
        mod = dm.model.get_submodule(ly.name)
        mod.parametrizations[ly.param].original.data.copy_(plain.pop(f"{ly.name}.{ly.param}"))
    missing, unexpected = dm.model.load_state_dict(plain, strict=False)
    bad = [k for k in unexpected]
    if bad:
        raise RefusedError(f"{path}: unexpected weights {bad[:3]}")
    return ckpt


def save_disco(dm: DiscoModel, path: str | Path, model_cfg: dict, task: str | None = None,
               info: dict | None = None, extra: dict | None = None) -> Path:
    """Save a DISCO model: masked weights, partition fingerprint, N and kept links."""
    part = dm.partition
    disco = {"nodes": part.nodes, **({"shares": list(part.shares)} if part.shares else {}),
             "placement": "receiver" if part.relay else "sender",
             "fingerprint": part.fingerprint(), "n_links": part.n_links,
             "kept": pack_bits(dm.kept), "ratio": dm.ratio, **(extra or {})}
    return save_checkpoint(Checkpoint(model=model_cfg, state_dict=dm.plain_state_dict(),
                                      input_shape=list(part.input_shape), task=task, disco=disco,
                                      info=info or {}), path)
