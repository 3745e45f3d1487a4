"""A non-leader of a served group: run the inferences that rank 0 starts, follow the group's changes.

Control messages from rank 0, in order: ``peers`` (a member moved: reconnect), ``go`` (run inference ``seq``
of request ``id``), ``abort`` (rank 0 abandoned every inference up to a number: stop the one running), ``end``.
A lost peer other than rank 0 ends only the inference running (rank 0 sees the loss and waits for the rank
to rejoin); the loss of rank 0 ends this node (a supervisor restarts the group).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from .errors import Aborted, Failed, PeerLost
from .group import STATS_EVERY_S
from .procstat import peak_rss_mb, rss_mb, trim_heap

log = logging.getLogger(__name__)
IDLE_S = 1e9  # a follower waits for rank 0 as long as its connection stays up


def follow(node: Any) -> None:
    """Serve as rank ``node.a.rank`` until rank 0 ends the group (returns) or is lost (:class:`PeerLost`)."""
    tr, eng = node.tr, node.engine
    last = 0.0
    while True:
        msg = tr.control(0, timeout=IDLE_S)
        if "peers" in msg:
            tr.update_peers(msg["peers"])
        if msg.get("end"):
            return
        if not msg.get("go"):
            continue
        seq = int(msg["seq"])
        if seq <= tr.abort_upto:
            continue
        try:
            if msg.get("lossless"):  # the self-test: fp32 on the wire, as rank 0
                with node.lossless():
                    eng.infer(None, seq=seq)
            else:  # with the requests rank 0 starts meanwhile, interleaved as rank 0 runs them
                def more(_running: int) -> list[tuple[None, int]]:
                    nonlocal last
                    now = time.monotonic()
                    if now - last >= STATS_EVERY_S:  # a long run of requests still reports
                        last = now
                        trim_heap()
                        tr.send_control(0, {"stats": stats(node)})
                    return [(None, s) for s in _more_gos(tr)]

                eng.run_many([(None, seq)], lambda s, out: None, tr.timeout, more)
                tr.flush()
        except Aborted:
            log.info("inference %d (request %s) abandoned by rank 0", seq, msg.get("id"))
            tr.purge(tr.abort_upto)
            continue
        except PeerLost as e:
            if e.peer == 0:
                raise
            log.warning("inference %d (request %s): %s", seq, msg.get("id"), e)
            continue
        except Failed as e:
            log.warning("inference %d (request %s) failed: %s", seq, msg.get("id"), e)
            tr.send_control(0, {"failed": f"inference {seq}: {e}"})
            continue
        now = time.monotonic()
        if now - last >= STATS_EVERY_S or msg.get("lossless"):
            last = now
            trim_heap()
            tr.send_control(0, {"stats": stats(node)})


def _more_gos(tr: Any) -> list[int]:
    """The numbers of the further ``go`` messages already here, next in rank 0's order (not a self-test's)."""
    while tr.inbox.poll(0):
        tr._pump_one()
    box, seqs = tr.stash.get((0, "C")), []
    while box and box[0].get("go") and not box[0].get("lossless"):
        s = int(box.popleft()["seq"])
        if s > tr.abort_upto:
            seqs.append(s)
    return seqs


def stats(node: Any) -> dict[str, Any]:
    """What this node reports to rank 0: RSS and the engine's totals."""
    return {"rss_mb": round(rss_mb(), 2), "peak_rss_mb": round(peak_rss_mb(), 2), "pid": os.getpid(),
            "totals": node.engine.totals.as_dict(), "stash_keys": len(node.tr.stash)}
