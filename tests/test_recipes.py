"""The recipes' shared run-table helpers (recipes/common.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
from common import epochs_of, options_of  # noqa: E402


def test_run_rows_with_optional_epochs_and_options():
    assert epochs_of(("n2_r0.1", 2, 0.1), 20) == 20
    assert epochs_of(("n2_r0.1_ft60", 2, 0.1, 60), 20) == 60
    assert epochs_of(("n2_r0.1_taylor", 2, 0.1, {"selection": "taylor"}), 20) == 20
    assert epochs_of(("x", 2, 0.1, 300, {"selection": "taylor"}), 20) == 300
    assert epochs_of(("cifar", 2, 0.1, "global", "magnitude", 30), 10, at=5) == 30
    assert options_of(("n2_r0.1", 2, 0.1)) == {}
    assert options_of(("n2_r0.1_ft60", 2, 0.1, 60)) == {}
    assert options_of(("x", 2, 0.1, 300, {"selection": "taylor"})) == {"selection": "taylor"}
