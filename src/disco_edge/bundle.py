"""One rank's folder of an ONNX export (see ENGINE.md): schedule, verified graphs, reference, run token."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import Refused

log = logging.getLogger(__name__)
TOKEN_ENV = "DISCO_RUN_TOKEN"  # the launcher's per-run token (as disco.runtime.node)
FORMATS = ("disco-onnx-schedule/1", "disco-schedule/1")
STEP_OPS = ("run", "send", "recv", "free")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise Refused(f"{path} is missing (is this a rank folder of an ONNX export?)") from None
    except (OSError, ValueError) as e:
        raise Refused(f"{path}: cannot read it as JSON ({e})") from None


def locate(path: str | Path, rank: int) -> tuple[Path, Path | None]:
    """(the rank folder, manifest.json or None) for an export root or a rank folder copied alone."""
    p = Path(path)
    if (p / f"rank{rank}" / "schedule.json").is_file():
        p = p / f"rank{rank}"
    if not (p / "schedule.json").is_file():
        raise Refused(f"{path} holds no schedule.json nor rank{rank}/schedule.json (an ONNX export: "
                      "disco export ... --format onnx)")
    for m in (p / "manifest.json", p.parent / "manifest.json"):
        if m.is_file():
            return p, m
    return p, None


def expected_sha256(man: dict[str, Any], rank: int, name: str) -> str | None:
    """The manifest's sha256 of ``rank<rank>/<name>`` (``files`` by relative path, or per rank under ``onnx``)."""
    files = man.get("files")
    if isinstance(files, dict) and f"rank{rank}/{name}" in files:
        v = files[f"rank{rank}/{name}"]
        return v.get("sha256") if isinstance(v, dict) else v
    ranks = (man.get("onnx") or {}).get("ranks")
    if isinstance(ranks, list) and rank < len(ranks):
        v = (ranks[rank].get("files") or {}).get(name)
        return v.get("sha256") if isinstance(v, dict) else v
    return None


@dataclass
class Bundle:
    """A verified rank folder: ``schedule`` (the JSON), ``graphs`` (file name -> path), ``manifest``."""

    folder: Path
    rank: int
    nodes: int
    schedule: dict[str, Any]
    manifest: dict[str, Any] = field(default_factory=dict)
    graphs: dict[str, Path] = field(default_factory=dict)

    @property
    def weight_bytes(self) -> int:
        """Bytes of this rank's graph files (weights inside or as external data next to them)."""
        return sum(p.stat().st_size for p in self.folder.iterdir() if p.suffix in (".onnx", ".data", ".bin"))

    def token(self) -> str:
        """The run token: the launcher's ``DISCO_RUN_TOKEN``, else the manifest's ``run_token``, else its
        ``manifest_hash`` (nodes of another export are refused at least)."""
        tok = (os.environ.get(TOKEN_ENV) or self.manifest.get("run_token") or self.manifest.get("manifest_hash")
               or "")
        if not tok:
            log.warning("no run token (neither %s nor the manifest's run_token): peers are not authenticated",
                        TOKEN_ENV)
        return str(tok)

    def reference(self) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """The shipped reference inputs and outputs: by the schedule's names, else ``input`` / ``output`` (one
        value) or ``output.0``, ``output.1``, ... (several), as ``disco export --format onnx`` writes them."""
        f = self.folder / "reference.npz"
        if not f.is_file():
            return None
        with np.load(f) as z:
            def pick(specs: list[dict[str, Any]], alias: str) -> list[np.ndarray]:
                if all(s["name"] in z for s in specs):
                    return [z[s["name"]] for s in specs]
                if len(specs) == 1 and alias in z:  # one tensor; one leaf of a dict or tuple is ``output.0``
                    return [z[alias]]
                return [z[f"{alias}.{i}"] for i in range(len(specs))]
            try:
                return pick(self.schedule["inputs"], "input"), pick(self.schedule["outputs"], "output")
            except KeyError as e:
                raise Refused(f"{f} lacks {e} (names: {', '.join(z.files)})") from None


def _check_schedule(s: Any, folder: Path, rank: int, nodes: int) -> None:
    if not isinstance(s, dict) or s.get("format") not in FORMATS:
        raise Refused(f"{folder}/schedule.json is not a {FORMATS[0]} schedule")
    if s.get("rank") != rank:
        raise Refused(f"{folder} is rank {s.get('rank')}'s folder, this node is rank {rank} (copy rank{rank}/ "
                      "to this device, or start it with --rank " f"{s.get('rank')})")
    if s.get("nodes") != nodes:
        raise Refused(f"{folder} is from a {s.get('nodes')}-node export, the run has {nodes} nodes")
    for i, st in enumerate(s.get("steps", [])):
        if st.get("op") not in STEP_OPS:
            raise Refused(f"{folder}/schedule.json step {i}: unknown op {st.get('op')!r} (known: {STEP_OPS})")


def check_manifest_hash(man: dict[str, Any], path: Path) -> None:
    """Refuse a manifest whose ``manifest_hash`` (sha256[:32] of its other fields' JSON, sort_keys) does not match
    (required in a ``disco export --format onnx`` manifest): an edited codec or file list is caught here."""
    want = man.get("manifest_hash")
    if want is None and man.get("format") != "disco-onnx":
        return
    rest = {k: v for k, v in man.items() if k != "manifest_hash"}
    if want != hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()[:32]:
        why = "missing" if want is None else "does not match the other fields"
        raise Refused(f"{path}: field 'manifest_hash' {why} (the manifest was edited after export: copy the export "
                      "again)")


def load(path: str | Path, rank: int, nodes: int, verify: bool = True) -> Bundle:
    """Read and verify rank ``rank``'s folder: schedule, every graph's sha256 against the manifest."""
    folder, man_path = locate(path, rank)
    man = _read_json(man_path) if man_path is not None else {}
    sched = _read_json(folder / "schedule.json")
    _check_schedule(sched, folder, rank, nodes)
    b = Bundle(folder, rank, nodes, sched, man)
    names = sorted({st["graph"] for st in sched["steps"] if st["op"] == "run"})
    for name in names:
        p = folder / name
        if p.parent != folder:
            raise Refused(f"{folder}/schedule.json runs {name!r}, outside its folder (an edited schedule?)")
        if not p.is_file():
            raise Refused(f"{p} is missing (the schedule runs it)")
        b.graphs[name] = p
    if verify:
        if man_path is None:
            raise Refused(f"no manifest.json next to {folder} to verify its files (copy it with the rank folder)")
        check_manifest_hash(man, man_path)
        for name in ["schedule.json", *names]:
            want = expected_sha256(man, rank, name)
            if want is None:
                raise Refused(f"{man_path} lists no sha256 for rank{rank}/{name}")
            if file_sha256(folder / name) != want:
                raise Refused(f"{folder / name}: sha256 differs from {man_path} (a damaged or edited file: "
                              "copy the export again)")
    return b
