"""The latency model's measured constants (fitted by ``python -m bench.latency_fit`` on results/latency.json;
the defaults are that fit, so an installed package plans without the repository)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime import latency as lat


@dataclass
class Calibration:
    """The latency model's parameters (see ``bench/latency_fit.py``)."""

    flop_s: float = 1.407e-11  # seconds per FLOP on one core (1 torch thread)
    op_s: float = 2.142e-05  # fixed cost of one op on one node (Python, dispatch)
    run_s: float = 0.0  # fixed cost of one compute segment (the ONNX engine's session run; torch: in op_s)
    msg_s: float = 4.009e-05  # fixed CPU cost of one message on its sender (index_select, encode)
    byte_s: float = 4.381e-10  # CPU cost per payload byte (gather, cast, copy) on the sender
    delay_a: float = 0.0005513  # delivery delay of one message: a + b * bytes (unpaced gloo) ...
    delay_b: float = 1.5e-09
    delay_paced_a: float = 0.0001  # ... and through the pacing thread
    delay_paced_b: float = 2.5e-10
    overhead_unshaped_s: float = 0.0001  # CPU time after each received message, unshaped links
    overhead_paced_s: float = 0.0002  # ... and paced ones (pacing thread hand-off)
    overhead_unshaped_byte_s: float = 5e-10  # ... plus this per received byte (unshaped)
    overhead_paced_byte_s: float = 3e-09  # ... (paced)
    wake_unshaped_s: float = 0.0001  # wake-up of a node blocked on a message that had not arrived (unshaped)
    wake_paced_s: float = 5e-05  # ... (paced)
    oversub: float = 0.9  # useful share of the cores while more node processes compute than there are cores
    corun: float = 0.85  # speed of each node process while more than one computes at once on a shared host
    wake_oversub_s: float = 0.0  # extra wake-up while node processes outnumber the cores (waiting for a core)
    busy_s: float = 0.0003  # extra delay of a message sent while the other nodes' computing fills the cores
    single_process: dict[str, float] = field(default_factory=dict)  # model -> measured one-process ms
    single_process_source: str = "results/latency.json"
    # codec -> seconds per value that encoding (sender) and decoding (receiver) cost beyond fp32's
    # (bench/codec_cost.py; fp32 is a view both ways, int8 takes a max-abs pass, a division and a cast)
    codec_encode_s: dict[str, float] = field(default_factory=dict)
    codec_decode_s: dict[str, float] = field(default_factory=dict)
    source: str = "defaults"

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """The calibration in a fit's JSON (``bench.latency_fit`` writes results/latency_model.json); the
        defaults when ``path`` is not a file."""
        p = Path(path)
        if not p.is_file():
            return cls()
        d = json.loads(p.read_text())
        known = {k: v for k, v in d.get("calibration", {}).items() if k in cls.__dataclass_fields__}
        return cls(**known, source=str(p.name))

    def wake(self, paced: bool, oversubscribed: bool) -> float:
        """Wake-up of a node blocked on a message, with the wait for a core when processes outnumber them."""
        return (self.wake_paced_s if paced else self.wake_unshaped_s) + (self.wake_oversub_s if oversubscribed else 0)

    def delay(self, paced: bool = False) -> lat.Delay:
        return lat.Delay(self.delay_paced_a, self.delay_paced_b) if paced else lat.Delay(self.delay_a, self.delay_b)
