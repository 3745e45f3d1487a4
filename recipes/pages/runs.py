"""Which runs of a results file go together: the separated-branches run to compare with, and the ratio sweeps."""

from __future__ import annotations


def lr_note(e: dict) -> str:
    """``", lr 0.001"`` for a run that records its fine-tuning rate, else ``""`` (the recipe's default)."""
    return f", lr {e['lr']:g}" if e.get("lr") else ""


def separated_for(e: dict, seps: list[dict]) -> dict | None:
    """The separated-branches run to compare ``e`` with: fine-tuned as long at the same rate, else as long,
    else the longest-tuned shorter one, else the shortest-tuned one."""
    same = [x for x in seps if x["epochs"] == e["epochs"]]
    if same:
        return next((x for x in same if x.get("lr") == e.get("lr")), same[0])
    shorter = [x for x in seps if x["epochs"] < e["epochs"]]
    return max(shorter, key=lambda x: x["epochs"]) if shorter else min(seps, key=lambda x: x["epochs"], default=None)


def sweeps(entries: list[dict]) -> dict[tuple, list[dict]]:
    """The ratio sweeps among the DISCO runs: (scores, epochs, lr) -> its runs at every N, separated branches
    with the same fine-tuning included. A setting run at three or more ratios at N=2 is a sweep (a line in the
    plots); any other run is an extra point."""
    disco = [e for e in entries if e["nodes"] > 1]
    out = {}
    for key in sorted({(e["selection"], e["epochs"], e.get("lr")) for e in disco if e["selection"] != "separated"},
                      key=lambda k: (k[1], k[2] or 0, k[0])):
        sel, ep, lr = key
        pts = [e for e in disco if (e["epochs"], e.get("lr")) == (ep, lr) and e["selection"] in (sel, "separated")]
        if len({e["ratio"] for e in pts if e["nodes"] == 2 and e["selection"] == sel}) >= 3:
            out[key] = pts
    return out


def sweep_label(key: tuple) -> str:
    sel, ep, lr = key
    return f"{sel}, {ep} epochs" + lr_note({"lr": lr})


def by_cost(entries: list[dict]) -> list[dict]:
    """Runs in table order: by N, then from the most links kept to the fewest, then by name."""
    return sorted(entries, key=lambda e: (e["nodes"], -e["ratio"], e["name"]))


def weights_share(e: dict) -> float:
    """The largest node's weights as a share of the whole model's."""
    return max(e["params_per_node"]) / e["params_dense"]


def moved(e: dict) -> str:
    """``"KB (dense KB)"``: the bytes a run moves per input against dense within-layer parallelism."""
    return f"{e['bytes'] / 1e3:.1f} (dense {e['dense_bytes'] / 1e3:.1f})"
