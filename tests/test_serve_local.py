"""One interpreter of a schedule: the export's in-process proof is the node engine over an in-process transport."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from disco_edge.errors import Failed
from tests import edge_export


def test_simulate_is_the_engine_over_queues(tmp_path: Path) -> None:
    from disco.edge.simulate import simulate

    edge_export.build(tmp_path)
    ref = np.load(tmp_path / "rank0" / "reference.npz")
    out, counters = simulate(tmp_path, {"x": ref["x"]})
    assert list(out) == ["out"]
    np.testing.assert_allclose(out["out"], ref["out"], rtol=1e-6, atol=1e-7)
    assert counters == {"messages": 2, "link_values": int(np.prod(edge_export.SHAPE))}


def test_a_deadlock_is_found_at_once(tmp_path: Path) -> None:
    """Rank 1 waits for a message that rank 0 never sends: a clear error, not a hang."""
    from disco_edge.local import run_group

    edge_export.build(tmp_path)
    s0 = json.loads((tmp_path / "rank0" / "schedule.json").read_text())
    s0["steps"] = s0["steps"][1:]  # rank 0 no longer sends the input
    (tmp_path / "rank0" / "schedule.json").write_text(json.dumps(s0))
    x = np.load(tmp_path / "rank0" / "reference.npz")["x"]
    with pytest.raises(Failed, match="deadlock"):
        run_group(tmp_path, {"x": x})


def test_a_message_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    from disco_edge.local import run_group

    edge_export.build(tmp_path, recv_shape=[1, 4, 3, 2])
    x = np.load(tmp_path / "rank0" / "reference.npz")["x"]
    with pytest.raises(Failed, match="bytes"):
        run_group(tmp_path, {"x": x})
