"""The ONNX engine's self-test runs on the lossless codec whatever --codec (as the torch engine's): with a lossy
codec, --max-rel-err bounds the served output and its failure says so (issue 43, item 5)."""

from __future__ import annotations

from pathlib import Path

from tests.serve_group import build
from tests.test_edge import run_nodes


def test_int8_with_a_tight_bound_fails_on_the_served_output_not_the_self_test(tmp_path: Path) -> None:
    d = build(tmp_path)
    codes, errs, _ = run_nodes(d, "--codec", "int8", "--max-rel-err", "1e-4")
    assert codes[0] == 3, errs
    assert "first served inference (codec int8): the split output differs from the single-process model" in errs[0]
    assert "self-test" not in errs[0] and "damaged" not in errs[0]


def test_int8_reports_its_served_error(tmp_path: Path) -> None:
    d = build(tmp_path)
    codes, errs, rep = run_nodes(d, "--codec", "int8", "--max-rel-err", "0.05")
    assert codes == [0, 0], errs
    assert 0 < rep["max_rel_err_vs_single_process"] <= 0.05


def test_a_wrong_reference_still_fails_the_lossless_self_test(tmp_path: Path) -> None:
    from tests import edge_export

    d = tmp_path / "bad"
    edge_export.build(d, wrong_ref=True)
    codes, errs, _ = run_nodes(d, "--codec", "int8", "--max-rel-err", "0.05")
    assert codes[0] == 3 and "self-test (lossless fp32 codec)" in errs[0] and "damaged" in errs[0], errs
