"""The quick cases of bench/faults.py (fault injection through the real command line); the long ones run there."""

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
