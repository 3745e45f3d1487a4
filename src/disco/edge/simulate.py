"""Run the N ranks of an ONNX export in one process (numpy + onnxruntime, no torch): each rank executes the
steps of its ``rankR/schedule.json`` (see ENGINE.md) and messages go through in-process queues, so the
proof of an export and the reference of the node engine need no network. One compute thread per session.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

ONNX_FORMAT = "disco-onnx-schedule/1"


def session(path: Path) -> Any:
    """An onnxruntime session on one compute thread (CPU)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


@dataclass
class Rank:
    """One rank's schedule, sessions and environment, with where it is in its steps."""

    schedule: dict[str, Any]
    sessions: dict[str, Any]
    env: dict[str, np.ndarray] = field(default_factory=dict)
    pc: int = 0

    @classmethod
    def load(cls, folder: Path) -> Rank:
        sch = json.loads((folder / "schedule.json").read_text())
        if sch.get("format") != ONNX_FORMAT:
            raise ValueError(f"{folder / 'schedule.json'}: format {sch.get('format')!r}, expected {ONNX_FORMAT!r}")
        graphs = {s["graph"] for s in sch["steps"] if s["op"] == "run"}
        return cls(sch, {g: session(folder / g) for g in sorted(graphs)})

    @property
    def rank(self) -> int:
        return int(self.schedule["rank"])

    def advance(self, queues: dict[tuple[int, int, int], deque]) -> bool:
        """Execute steps until the end or a receive whose message is not there; returns whether any ran."""
        steps, ran = self.schedule["steps"], False
        while self.pc < len(steps):
            st = steps[self.pc]
            if st["op"] == "run":
                sess = self.sessions[st["graph"]]
                outs = sess.run(st["outputs"], {i.name: self.env[i.name] for i in sess.get_inputs()})
                self.env.update(zip(st["outputs"], outs, strict=True))
            elif st["op"] == "send":
                queues.setdefault((self.rank, st["to"], st["tag"]), deque()).append(self.env[st["value"]].copy())
            elif st["op"] == "recv":
                q = queues.get((st["from"], self.rank, st["tag"]))
                if not q:
                    return ran
                msg = q.popleft()
                if list(msg.shape) != st["shape"] or str(msg.dtype) != st["dtype"]:
                    raise ValueError(f"rank {self.rank}: message {st['value']} is {msg.dtype}{list(msg.shape)}, "
                                     f"the schedule says {st['dtype']}{st['shape']}")
                self.env[st["value"]] = msg
            elif st["op"] == "free":
                for v in st["values"]:
                    self.env.pop(v, None)
            self.pc += 1
            ran = True
        return ran


def simulate(folder: str | Path, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Run every ``rankR/`` of export ``folder`` on ``inputs`` (fed on rank 0): the leader's outputs by name,
    and counters (messages and link values sent)."""
    folder = Path(folder)
    ranks = [Rank.load(p) for p in sorted(folder.glob("rank*"), key=lambda p: int(p.name[4:]))]
    ranks[0].env.update(inputs)
    queues: dict[tuple[int, int, int], deque] = {}
    while not all(r.pc == len(r.schedule["steps"]) for r in ranks):
        if not any([r.advance(queues) for r in ranks]):
            stuck = {r.rank: r.schedule["steps"][r.pc] for r in ranks if r.pc < len(r.schedule["steps"])}
            raise RuntimeError(f"the schedules deadlock: ranks wait for {stuck}")
    sends = [s for r in ranks for s in r.schedule["steps"] if s["op"] == "send"]
    counters = {"messages": len(sends),
                "link_values": sum(int(np.prod(s["shape"])) for s in sends if s["kind"] == "links")}
    return {o["name"]: ranks[0].env[o["name"]] for o in ranks[0].schedule["outputs"]}, counters
