"""Which links to keep (recipes/selection/run.py, results/cifar10_selection.json): docs/selection.md's table,
the target of learned selection against random links, the budget comparison and the plot."""

from __future__ import annotations

from pathlib import Path

from .md import md_table, mean_std

LEARNED = ("magnitude", "taylor", "lasso")


def selection_groups(entries: list[dict]) -> dict[tuple, list[dict]]:
    """Runs of results/cifar10_selection.json by (budget, N, target r, selection, epochs, subset)."""
    out: dict[tuple, list[dict]] = {}
    for e in entries:
        budget = e["budget"] + (f", latency weight {e['latency_weight']:g}" if e.get("latency_weight") else "")
        k = (budget, e["nodes"], e["target_ratio"], e["selection"], e["epochs"], e["train_subset"])
        out.setdefault(k, []).append(e)
    return out


def _top1(runs: list[dict]) -> tuple[float, float]:
    return mean_std([e["top1"] for e in runs])


def _sel_order(sel: str) -> int:
    return ["random", *LEARNED].index(sel) if sel in LEARNED + ("random",) else 9


def selection_table(entries: list[dict]) -> str:
    """Mean and std of top-1 per selection and setting, and the difference to random links."""
    groups = selection_groups(entries)
    rows = []
    for k in sorted(groups, key=lambda k: (k[0], -k[1], -k[2], k[4], k[5] or 0, _sel_order(k[3]))):
        budget, n, r, sel, ep, sub = k
        m, sd = _top1(groups[k])
        rnd = groups.get((budget, n, r, "random", ep, sub))
        vs = f"{m - _top1(rnd)[0]:+.2f}" if rnd and sel != "random" else ""
        rows.append([budget, n, f"{r:g}", sel, len(groups[k]), f"{m:.2f}", f"{sd:.2f}", vs,
                     f"{ep} epochs on {sub} images" if sub else f"{ep} epochs"])
    return md_table(rows, ["budget", "N", "r", "selection", "seeds", "top-1 mean", "std", "vs random",
                           "fine-tuning"])


def selection_verdict(entries: list[dict], nodes: int = 4, ratio: float = 0.1) -> str:
    """Does the best learned selection beat random by >= 1 point, mean - std above random's mean + std?"""
    groups = selection_groups(entries)
    lines = []
    for k in sorted(g for g in groups if g[1] == nodes and g[2] == ratio and g[3] == "random"):
        rnd = _top1(groups[k])
        learned = [(sel, _top1(groups[(k[0], k[1], k[2], sel, k[4], k[5])]))
                   for sel in LEARNED if (k[0], k[1], k[2], sel, k[4], k[5]) in groups]
        if not learned:
            continue
        sel, (m, sd) = max(learned, key=lambda x: x[1][0])
        n_seeds = len(groups[(k[0], k[1], k[2], sel, k[4], k[5])])
        ok = m - rnd[0] >= 1.0 and m - sd > rnd[0] + rnd[1]
        verdict = ("met" if ok else "not met") if min(n_seeds, len(groups[k])) >= 3 else "undecided (< 3 seeds)"
        lines.append(f"N={nodes}, r={ratio:g} ({k[0]} budget, {k[4]} epochs on {k[5]} images): best learned "
                     f"selection {sel} {m:.2f} +- {sd:.2f} ({n_seeds} seeds) vs random {rnd[0]:.2f} +- {rnd[1]:.2f} "
                     f"({len(groups[k])} seeds): {m - rnd[0]:+.2f} points; target (>= +1.0 and mean - std above "
                     f"random's mean + std) {verdict}.")
    return "\n".join(lines) if lines else "No N=4, r=0.1 runs yet."


def profile(runs: list[dict]) -> str:
    """``mean +- std (seeds; r, FLOPs, weights per node[, messages])`` of one setting's runs."""
    m, sd = _top1(runs)
    e = runs[0]
    return (f"{m:.2f} +- {sd:.2f} ({len(runs)} seeds; r {e['ratio']:.3f}, "
            f"FLOPs {e['flops_total'] / e['flops_dense']:.2f}x, "
            f"weights per node at most {max(e['params_per_node']) / e['params_dense']:.2f}x of the model"
            + (f", {e['messages_per_inference']} messages per inference" if e.get("messages_per_inference")
               else "") + ")")


def budget_comparison(entries: list[dict]) -> str:
    """The joint budget, or a latency weight, against the plain global budget at equal selection, r and
    fine-tuning: accuracy, FLOPs, weights and messages per inference."""
    groups = selection_groups(entries)
    lines = []
    for k in sorted(g for g in groups if g[0] != "global"):
        ref = groups.get(("global", *k[1:]))
        if not ref:
            continue
        d = _top1(groups[k])[0] - _top1(ref)[0]
        lines.append(f"N={k[1]}, r={k[2]:g}, {k[3]} selection, {k[4]} epochs on {k[5]} images: {k[0]} "
                     f"{profile(groups[k])} against global {profile(ref)}: {d:+.2f} points.")
    return "\n".join(lines) if lines else "No joint-budget runs yet."


def plot_selection(entries: list[dict], path: Path) -> None:
    """Mean +- std of top-1 per setting and selection, each run as a dot."""
    from .plots import pyplot, save

    groups = selection_groups(entries)
    settings = sorted({(k[0], k[1], k[2]) for k in groups}, key=lambda s: (s[0], -s[1], -s[2]))
    fig, ax = pyplot().subplots(figsize=(max(5, 2 + 1.6 * len(settings)), 4))
    for i, sel in enumerate(["random", *LEARNED]):
        xs, ms, sds = [], [], []
        for j, st in enumerate(settings):
            runs = [e for k, v in groups.items() if (k[0], k[1], k[2]) == st and k[3] == sel for e in v]
            if runs:
                m, sd = _top1(runs)
                xs.append(j + (i - 1.5) * 0.18)
                ms.append(m)
                sds.append(sd)
                ax.scatter([xs[-1]] * len(runs), [e["top1"] for e in runs], s=8, color=f"C{i}", alpha=0.5)
        if xs:
            ax.errorbar(xs, ms, yerr=sds, fmt="o", capsize=4, color=f"C{i}", label=sel)
    ax.set_xticks(range(len(settings)), [f"{b}\nN={n}, r={r:g}" for b, n, r in settings])
    ax.set_ylabel("CIFAR-10 top-1 (%)")
    ax.set_xlim(-0.6, len(settings) - 0.4)
    ax.set_title("Which links to keep (mean +- std over seeds; dots: runs)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    save(fig, path)
