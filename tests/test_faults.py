"""The quick cases of bench/faults.py (fault injection through the real command line) on both engines; the long
ones run there."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import faults

pytestmark = pytest.mark.dist
TIMEOUT = 4.0
CASES = {c.name: c for c in faults.cases()}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return faults.make_export(tmp_path_factory.mktemp("faults") / "base")


@pytest.fixture(scope="module")
def onnx_base(tmp_path_factory) -> Path:
    return faults.make_export(tmp_path_factory.mktemp("faults-onnx") / "base", engine="onnx")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["stop_leader_run", "stop_peer_run"])
def test_a_frozen_node_ends_the_run_within_timeout_plus_5s(base: Path, name: str) -> None:
    o = faults.run_case(CASES[name], base, TIMEOUT)
    assert o.exit_code == 3, o
    assert o.seconds <= TIMEOUT + 5, o
    assert CASES[name].needs in o.message and o.stderr_lines == 1, o  # names the frozen rank, in one line
    assert (o.leftover_processes, o.leftover_files) == (0, 0), o


@pytest.mark.parametrize("name", ["edit_kept", "edit_shard_sha", "weights_path"])
def test_an_edited_export_is_refused_before_compute(base: Path, name: str) -> None:
    o = faults.run_case(CASES[name], base, TIMEOUT)
    assert o.ok and o.exit_code == 2 and o.stderr_lines == 1, o


@pytest.mark.slow
def test_sigterm_ends_the_nodes_and_cleans_up(base: Path) -> None:
    o = faults.run_case(CASES["sigterm"], base, TIMEOUT)
    assert o.ok and o.exit_code == 143 and o.stderr_lines == 1 and o.seconds < 5, o


def test_non_leader_gives_up_on_a_foreign_listener(base: Path) -> None:
    o = faults.run_case(CASES["foreign_listener"], base, TIMEOUT)
    assert o.ok and o.exit_code == 3, o


@pytest.mark.parametrize("name", ["kill_peer_run", "kill_peer_stream"])
def test_onnx_engine_names_a_killed_peer_and_leaves_nothing(onnx_base: Path, name: str) -> None:
    """disco_edge's DISCO_NODE_HOOKS: rank 1 kills itself before its 6th inference (or the 21st of a stream); the
    run fails (3) naming it."""
    o = faults.run_case(faults.for_engine(CASES[name], "onnx"), onnx_base, TIMEOUT)
    assert o.exit_code == 3 and "lost rank 1" in o.message and o.stderr_lines == 1, o
    assert (o.leftover_processes, o.leftover_files) == (0, 0) and o.ok, o


@pytest.mark.parametrize("name", ["shard_byte", "edit_codec", "onnx_opset"])
def test_onnx_engine_refuses_an_edited_export(onnx_base: Path, name: str) -> None:
    """A flipped byte of an ONNX file (sha256), an edited manifest field (manifest_hash), an opset onnxruntime
    lacks (the manifest resealed to match): exit 2 in one line, nothing left."""
    o = faults.run_case(faults.for_engine(CASES[name], "onnx"), onnx_base, TIMEOUT)
    assert o.exit_code == 2 and o.stderr_lines == 1 and "Traceback" not in o.message, o
    assert o.ok, o


def test_cases_per_engine() -> None:
    na = {c.name: faults.for_engine(c, "onnx") for c in faults.cases()}
    assert all(na[f"{w}_{s}_stream"].engine == "onnx" for w in ("kill", "stop") for s in ("leader", "peer")), na
    assert isinstance(faults.for_engine(CASES["onnx_opset"], "torch"), str)
    assert faults.for_engine(CASES["shard_byte"], "onnx").engine == "onnx"


def test_onnx_engine_hooks_are_off_unless_named(monkeypatch, tmp_path: Path) -> None:
    """disco_edge.hooks: nothing without DISCO_NODE_HOOKS; bench/faults.py's hooks on "inference" and "stream";
    a missing file or a point the engine lacks is refused (exit 2)."""
    from disco_edge import hooks
    from disco_edge.errors import Refused

    monkeypatch.delenv(hooks.HOOKS_ENV, raising=False)
    assert hooks.from_env() == {}
    for k, v in faults.fault_env(1, "run", 5).items():
        monkeypatch.setenv(k, v)
    assert list(hooks.from_env()) == ["inference"]
    for k, v in faults.fault_env(1, "stream", 5).items():
        monkeypatch.setenv(k, v)
    assert list(hooks.from_env()) == ["stream"]
    odd = tmp_path / "odd.py"
    odd.write_text("def install_node_hooks(register):\n    register('gather', print)\n")
    monkeypatch.setenv(hooks.HOOKS_ENV, str(odd))
    with pytest.raises(Refused, match="no hook point 'gather'"):
        hooks.from_env()
    monkeypatch.setenv(hooks.HOOKS_ENV, str(tmp_path / "none.py"))
    with pytest.raises(Refused, match="cannot install node hooks"):
        hooks.from_env()
