"""An export is verified before any compute: every edit of the manifest is refused by field, and a
manifest names no file outside its folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from disco.checkpoint import pack_bits, unpack_bits
from disco.errors import EXIT_REFUSED, exit_code
from disco.graph import partition
from disco.masks import DiscoModel
from disco.models import build_model
from disco.runtime.export import ShardError, export, load_node, read_manifest
from disco.runtime.node import _load_input


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("exp")
    torch.manual_seed(0)
    model = build_model("cifar_resnet8")
    part = partition(model, (1, 3, 32, 32), 2)
    kept = np.random.default_rng(0).random(part.n_links) < 0.3
    export(DiscoModel(model, part, kept), part, kept, d, {"name": "cifar_resnet8", "kwargs": {}})
    return d


def _copy(src: Path, dst: Path, edit) -> Path:  # noqa: ANN001
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    man = json.loads((dst / "manifest.json").read_text())
    edit(man)
    (dst / "manifest.json").write_text(json.dumps(man))
    return dst


def test_untouched_export_loads(exported: Path) -> None:
    for j in range(2):
        assert load_node(exported, j, 2).plan.rank == j
    x, ref = _load_input(None, read_manifest(exported), exported)
    assert x.shape == (1, 3, 32, 32) and ref


def _move_one_link(man: dict) -> None:
    kept = unpack_bits(man["kept"], man["n_links"])
    on, off = np.flatnonzero(kept)[0], np.flatnonzero(~kept)[0]
    kept[on], kept[off] = False, True  # the same number of links: a plain count would not see it
    man["kept"] = pack_bits(kept)


EDITS = {
    "kept": _move_one_link,
    "shards": lambda m: m["shards"][1].update(sha256="0" * 64),
    "shard_params": lambda m: m["shards"][0].update(params=m["shards"][0]["params"] + 1),
    "codec": lambda m: m.update(codec="int8"),
    "input_shape": lambda m: m.update(input_shape=[2, 3, 32, 32]),
    "model_hash": lambda m: m.update(model_hash="f" * 32),
    "manifest_hash": lambda m: m.update(manifest_hash="0" * 32),
    "reference_sha256": lambda m: m.update(reference_sha256="0" * 64),
    "schedules": lambda m: m["schedules"][1].update(sha256="0" * 64),
}


@pytest.mark.parametrize("what", sorted(EDITS))
def test_any_edit_is_refused_naming_the_field(exported: Path, tmp_path: Path, what: str) -> None:
    d = _copy(exported, tmp_path / "e", EDITS[what])
    field = {"shard_params": "shards"}.get(what, what)
    pattern = f"manifest.json: field.*'{field}'" if field != "model_hash" else "another model|'model_hash'"
    for rank in range(2):
        with pytest.raises(ShardError, match=pattern) as ei:
            load_node(d, rank, 2)
        assert exit_code(ei.value) == EXIT_REFUSED


def test_the_manifest_checksum_of_a_shard_is_read(exported: Path, tmp_path: Path) -> None:
    """A consistent manifest whose shard list names another shard's checksum: the node sees it."""
    d = _copy(exported, tmp_path / "e", lambda m: None)
    raw = json.loads((d / "manifest.json").read_text())
    assert raw["shards"][0]["sha256"] != raw["shards"][1]["sha256"]
    raw["shards"][0]["sha256"], raw["shards"][1]["sha256"] = raw["shards"][1]["sha256"], raw["shards"][0]["sha256"]
    (d / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ShardError, match="'shards'"):
        load_node(d, 0, 2)


def test_missing_field_is_a_clean_refusal(exported: Path, tmp_path: Path) -> None:
    d = _copy(exported, tmp_path / "e", lambda m: m.pop("model_hash"))
    with pytest.raises(ShardError, match="field 'model_hash' missing"):
        read_manifest(d)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["model"]["kwargs"].update(weights="/etc/passwd"), "model.kwargs.weights"),
    (lambda m: m["model"]["kwargs"].update(backbone_weights="x.pt"), "model.kwargs.backbone_weights"),
    (lambda m: m["model"]["kwargs"].update(num_classes="../../x"), "model.kwargs.num_classes"),
    (lambda m: m["shards"][0].update(file="../node0.safetensors"), r"shards\[0\]"),
])
def test_manifest_names_no_file_outside_its_folder(exported: Path, tmp_path: Path, edit, match: str) -> None:  # noqa: ANN001
    d = _copy(exported, tmp_path / "e", edit)
    with pytest.raises(ShardError, match=match):
        load_node(d, 0, 2)


def test_edited_reference_refused_at_the_leader(exported: Path, tmp_path: Path) -> None:
    d = _copy(exported, tmp_path / "e", lambda m: None)
    raw = bytearray((d / "reference.safetensors").read_bytes())
    raw[-4:] = b"\0\0\0\0"
    (d / "reference.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="'reference_sha256'"):
        _load_input(None, read_manifest(d), d)


def test_edited_schedule_is_refused(exported: Path, tmp_path: Path) -> None:
    """A schedule file edited after export (its step list reordered) is refused by its sha256; one whose
    manifest entry is updated consistently is refused as not the partition's schedule."""
    d = _copy(exported, tmp_path / "e", lambda m: None)
    sch = json.loads((d / "node1.schedule.json").read_text())
    assert sch["format"] == "disco-schedule/1" and sch["rank"] == 1
    sch["steps"] = sch["steps"][1:] + sch["steps"][:1]
    (d / "node1.schedule.json").write_text(json.dumps(sch))
    with pytest.raises(ShardError, match="sha256"):
        load_node(d, 1, 2)
