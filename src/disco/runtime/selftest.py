"""The start-up self-test: before a node serves any input, the ranks run the export's shipped reference input
once through the split model and stop (exit 3) when its output is not the reference output.

The hash checks at load time catch a damaged or mixed export; they cannot catch one that was edited
consistently (a weight changed and its checksums rewritten), nor a runtime that computes wrong. The test
runs with the lossless fp32 wire codec whatever the run's codec, so its bound (``--max-rel-err``, default
:data:`DEFAULT_MAX_REL_ERR`) does not depend on the codec.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from ..errors import RunFailure
from .inputs import Reference
from .rendezvous import DeadlineStore, wait_keys

DEFAULT_MAX_REL_ERR = 1e-4
KEY = "selftest"


def _leader_verdict(out: Any, ref: Reference, limit: float) -> dict[str, Any]:
    from .export import compare_reference

    try:
        err = compare_reference(out, ref)
    except (ValueError, TypeError) as e:
        return {"ok": False, "why": f"the output does not have the reference's form ({e})"}
    if not err <= limit:  # NaN fails too
        return {"ok": False, "err": err,
                "why": f"the export's reference input gives an output {err:.2e} away from the shipped reference "
                       f"(relative; more than --max-rel-err {limit:g}): the weights or plan are not those "
                       "that were exported"}
    return {"ok": True, "err": err}


def _wait_seen(store: DeadlineStore, world: int) -> None:
    try:
        wait_keys(store, [f"{KEY}-seen/{r}" for r in range(1, world)], 5.0, "self-test")
    except RunFailure:  # a peer that does not read it is ended by its watchdog
        pass


def self_test(ex: Any, tr: Any, store: DeadlineStore, rank: int, world: int,
              probe: tuple[torch.Tensor, Reference] | None, limit: float | None, timeout: float) -> float | None:
    """Run the reference input once on every rank (``probe`` on rank 0, None elsewhere) with the fp32 codec;
    rank 0 compares and publishes the verdict, every rank raises :class:`RunFailure` on a failed test.
    Returns the error found (rank 0) or None."""
    saved = tr.codec
    tr.codec = tr.raw  # every rank swaps alike, so the message sizes still agree
    try:
        out = ex.run([probe[0]] if rank == 0 and probe is not None else None)
    finally:
        tr.codec = saved
    tr.flush()
    if probe is not None:  # rank 0
        verdict = _leader_verdict(out, probe[1], DEFAULT_MAX_REL_ERR if limit is None else limit)
        store.set(KEY, json.dumps(verdict))
        if not verdict["ok"]:  # the store lives here: let every node read why before leaving
            _wait_seen(store, world)
    else:
        wait_keys(store, [KEY], timeout, "waiting for the self-test")
        verdict = json.loads(store.get(KEY))
        store.set(f"{KEY}-seen/{rank}", "1")
    if not verdict["ok"]:
        raise RunFailure(f"self-test failed on rank 0 (the leader, which compares the output): {verdict['why']}")
    return verdict.get("err") if probe is not None else None
