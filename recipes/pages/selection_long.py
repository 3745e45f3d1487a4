"""The long protocol (recipes/selection/long.py, results/cifar10_selection_long.json): accuracy against images
seen, issue 32's three targets stated from the data, and results/cifar10_selection_long.png.

A setting is (N, target r, budget, selection) at one length; its length is the images seen rounded to thousands
(``250k``). Lasso runs whose groups were charged the joint budget's rooms (``lasso_weight`` "joint") are the
selection ``ROOMS``; runs with a setting of the screen's (``setting``, e.g. pruning over 30% of the run)
are the selection ``lasso, SETTING``. A target is judged only on 3 seeds or more; with fewer the page says how
many are done."""

from __future__ import annotations

from pathlib import Path

from .md import md_table, mean_std
from .selection import profile

LONG, DENSE, TUNE = "cifar10_selection_long", "cifar10_resnet", "cifar10_selection_tune"
TUNE_SETTINGS = 5  # the screen's settings (recipes/selection/long.py TUNE)
ROOMS = "lasso, rooms-charged"  # --lasso-weight joint: a second way of meeting the joint caps
SEEDS = 3
CURVE_LENGTHS = (10, 100, 250)  # thousands of images seen: the curves of the N=2 r=0.2 budgets
# the settings the targets need: (N, target r, budget, selection, thousands of images seen)
PLANNED = ([(2, 0.2, b, "lasso", k) for b in ("global", "joint") for k in CURVE_LENGTHS]
           + [(4, 0.1, "global", s, 250) for s in ("lasso", "random")])
JOINT_CAPS = {"flops": 0.55, "weights": 0.30}
COLUMNS = ["N", "r", "budget", "selection", "images seen", "seeds done", "top-1 mean", "std", "vs dense",
           "validation top-1", "r (achieved)", "FLOPs / dense", "weights per node / dense"]


def length_k(e: dict) -> int:
    """A run's length in thousands of images seen (249,832 -> 250)."""
    return round((e.get("train_images_seen") or 0) / 1000)


def groups(entries: list[dict]) -> dict[tuple, list[dict]]:
    """Runs by (N, target r, budget, selection, thousands of images seen); separated branches are selection
    ``separated`` at r = 0, whatever budget they name."""
    out: dict[tuple, list[dict]] = {}
    for e in entries:
        sel = "separated" if e["target_ratio"] == 0 else e["selection"]
        sel = ROOMS if sel == "lasso" and e.get("lasso_weight") == "joint" else sel
        sel = f"{sel}, latency weight {e['latency_weight']:g}" if e.get("latency_weight") else sel
        sel = f"{sel}, {e['setting']}" if e.get("setting") not in (None, "protocol") else sel  # the screen's
        out.setdefault((e["nodes"], e["target_ratio"], e["budget"], sel, length_k(e)), []).append(e)
    return out


def dense_top1(data: dict) -> float | None:
    """The dense checkpoint's top-1 (results/cifar10_resnet.json's ``dense`` entry)."""
    return next((e["top1"] for e in data.get(DENSE) or [] if e["name"] == "dense"), None)


def flops_share(runs: list[dict]) -> float:
    return max(e["flops_total"] / e["flops_dense"] for e in runs)


def weights_share(runs: list[dict]) -> float:
    return max(max(e["params_per_node"]) / e["params_dense"] for e in runs)


def _row(k: tuple, runs: list[dict], dense: float | None) -> list[object]:
    n, r, budget, sel, length = k
    head = [n, f"{r:g}", budget, sel, f"{length}k", f"{len(runs)} of {SEEDS}"]
    if not runs:
        return head + ["-"] * (len(COLUMNS) - len(head))
    m, sd = mean_std([e["top1"] for e in runs])
    val = [e["val_top1"] for e in runs if e.get("val_top1") is not None]
    return head + [f"{m:.2f}", f"{sd:.2f}", "-" if dense is None else f"{m - dense:+.2f}",
                   f"{mean_std(val)[0]:.2f}" if val else "-", f"{runs[0]['ratio']:.3f}", f"{flops_share(runs):.2f}",
                   f"{weights_share(runs):.2f}"]


def table(data: dict) -> str:
    """Every planned setting (and any other run) with its seeds done, mean, std and cost."""
    g = groups(data.get(LONG) or [])
    keys = sorted(set(PLANNED) | set(g), key=lambda k: (k[0], -k[1], k[2], k[3], k[4]))
    return md_table([_row(k, g.get(k, []), dense_top1(data)) for k in keys], COLUMNS)


def _ms(runs: list[dict]) -> str:
    m, sd = mean_std([e["top1"] for e in runs])
    return f"{m:.2f} +- {sd:.2f} ({len(runs)} seeds)"


def _trend(g: dict, key: tuple) -> str:
    """How the mean moved from the previous measured length to this one (whether more length would help)."""
    runs = g[key]
    before = [k for k in g if k[:4] == key[:4] and k[4] < key[4]]
    if not before:
        return ""
    prev = max(before, key=lambda k: k[4])
    d = mean_std([e["top1"] for e in runs])[0] - mean_std([e["top1"] for e in g[prev]])[0]
    return f"; from {prev[4]}k to {key[4]}k images the mean moved {d:+.2f} points"


def _at_length(g: dict, setting: tuple, max_k: int, ok) -> tuple | None:  # noqa: ANN001
    """The key to judge ``setting`` at: the shortest length <= ``max_k`` with 3 seeds that passes ``ok``, else the
    longest with 3 seeds, else the longest measured (fewer seeds), else None."""
    keys = sorted((k for k in g if k[:4] == setting and k[4] <= max_k), key=lambda k: k[4])
    full = [k for k in keys if len(g[k]) >= SEEDS]
    return next((k for k in full if ok(g[k])), None) or (full[-1] if full else (keys[-1] if keys else None))


def _gap_verdict(g: dict, setting: tuple, dense: float, points: float) -> tuple[str, str]:
    """(verdict, sentence) for "``setting`` within ``points`` of dense at <= 250k images seen"."""
    def close(runs: list[dict]) -> bool:
        return mean_std([e["top1"] for e in runs])[0] >= dense - points

    k = _at_length(g, setting, 250, close)
    if k is None:
        return "not measured yet", "No run yet."
    runs = g[k]
    gap = mean_std([e["top1"] for e in runs])[0] - dense
    text = f"At {k[4]}k images seen: {_ms(runs)}, {gap:+.2f} points vs dense ({dense:.2f})"
    if len(runs) < SEEDS:
        return "not measured yet", text + f"; {len(runs)} of {SEEDS} seeds done, no verdict yet."
    if gap >= -points:
        return "met", text + f": within {points:g} of dense."
    return "not met", text + f": {-points - gap:.2f} points short of {-points:+g}{_trend(g, k)}."


def joint_target(g: dict, dense: float, sel: str = "lasso") -> str:
    """N=2 r=0.2 joint budget (selection ``sel``) within 1.5 points of dense under the caps, above separated
    branches."""
    verdict, text = _gap_verdict(g, (2, 0.2, "joint", sel), dense, 1.5)
    runs = [e for k, v in g.items() if k[:4] == (2, 0.2, "joint", sel) for e in v]
    if runs:
        fl, w = flops_share(runs), weights_share(runs)
        caps = fl <= JOINT_CAPS["flops"] + 5e-4 and w <= JOINT_CAPS["weights"] + 5e-4
        text += (f" Caps: FLOPs {fl:.3f}x (<= {JOINT_CAPS['flops']}), weights per node {w:.3f}x "
                 f"(<= {JOINT_CAPS['weights']}): {'held' if caps else 'broken'}.")
        verdict = verdict if caps else "not met"
    seps = [k for k in g if k[:2] == (2, 0.0) and k[3] == "separated" and len(g[k]) >= SEEDS]
    if not seps:
        text += " Separated branches (N=2, r=0) at that length: not measured yet."
        verdict = "not met" if verdict == "not met" else "not measured yet"
    else:
        skey = max(seps, key=lambda k: k[4])  # the joint runs of that length against the separated branches'
        length, sep, same = skey[4], g[skey], g.get((2, 0.2, "joint", sel, skey[4]), [])
        jm, jsd = mean_std([e["top1"] for e in same]) if same else (float("nan"), 0.0)
        sm, ssd = mean_std([e["top1"] for e in sep])
        above = jm - jsd > sm + ssd
        text += (f" Separated branches at {length}k: {_ms(sep)}; joint mean - std "
                 f"{'above' if above else 'not above'} their mean + std.")
        verdict = verdict if above or verdict != "met" else "not met"
    return f"- Joint budget ({sel}), N=2 r=0.2, within 1.5 points of dense: **{verdict}**. {text}"


def caps_ways(g: dict) -> str:
    """Issue 32 item 3: the two ways of meeting the joint caps at 250k images seen, side by side."""
    a, b = g.get((2, 0.2, "joint", "lasso", 250), []), g.get((2, 0.2, "joint", ROOMS, 250), [])
    head = ("- Two ways of meeting the joint caps at 250k images (N=2 r=0.2): lasso groups charged their bytes "
            "(the default) against charged their share of the byte, FLOPs and weight rooms (`--lasso-weight joint`)")
    if min(len(a), len(b)) < SEEDS:
        return f"{head}: **not measured yet** ({len(a)} and {len(b)} of {SEEDS} seeds done)."
    (am, asd), (bm, bsd) = mean_std([e["top1"] for e in a]), mean_std([e["top1"] for e in b])
    apart = abs(am - bm) > asd + bsd
    return (f"{head}: {_ms(a)} against {_ms(b)}, {bm - am:+.2f} points for the rooms-charged lasso "
            f"({'more' if apart else 'less'} than the two stds apart), r {b[0]['ratio']:.3f} against "
            f"{a[0]['ratio']:.3f}.")


def global_target(g: dict, dense: float) -> str:
    verdict, text = _gap_verdict(g, (2, 0.2, "global", "lasso"), dense, 1.0)
    return f"- Global budget, N=2 r=0.2, within 1.0 point of dense: **{verdict}**. {text}"


def lasso_target(g: dict) -> str:
    """N=4 r=0.1 at 250k: lasso beats random by >= 1 point, mean - std above random's mean + std."""
    las, rnd = g.get((4, 0.1, "global", "lasso", 250), []), g.get((4, 0.1, "global", "random", 250), [])
    head = "- Lasso against random, N=4 r=0.1 at 250k images, by >= 1.0 point and one std:"
    if not las or not rnd:
        return f"{head} **not measured yet**: lasso {len(las)}, random {len(rnd)} seeds done."
    (lm, lsd), (rm, rsd) = mean_std([e["top1"] for e in las]), mean_std([e["top1"] for e in rnd])
    text = f"lasso {_ms(las)}, random {_ms(rnd)}: {lm - rm:+.2f} points"
    if min(len(las), len(rnd)) < SEEDS:
        return f"{head} **not measured yet**. {text}; fewer than {SEEDS} seeds, no verdict yet."
    ok = lm - rm >= 1.0 and lm - lsd > rm + rsd
    short = "" if ok else (f"; short by {max(1.0 - (lm - rm), (rm + rsd) - (lm - lsd)):.2f} points (needs +1.0 and "
                           "lasso's mean - std above random's mean + std)")
    return f"{head} **{'met' if ok else 'not met'}**. {text}{short}."


def lasso_verdict(data: dict) -> str:
    """The README's selection line: issue 32's lasso-against-random target at the long protocol."""
    return lasso_target(groups(data.get(LONG) or [])).removeprefix("- ")


def budgets(data: dict) -> str:
    """The README's line: the joint against the global budget at N=2 r=0.2, at the longest length both ran."""
    g = groups(data.get(LONG) or [])
    both = sorted(k[4] for k in g if k[:4] == (2, 0.2, "joint", "lasso") and (2, 0.2, "global", "lasso", k[4]) in g)
    if not both:
        return "No run of the long protocol has both budgets yet (results/cifar10_selection_long.json)."
    joint, glob = g[(2, 0.2, "joint", "lasso", both[-1])], g[(2, 0.2, "global", "lasso", both[-1])]
    d = mean_std([e["top1"] for e in joint])[0] - mean_std([e["top1"] for e in glob])[0]
    dense = dense_top1(data)
    return (f"N=2, r=0.2, lasso selection, {both[-1]}k training images seen (the long protocol): joint "
            f"{profile(joint)} against global {profile(glob)}: {d:+.2f} points"
            + ("." if dense is None else f" (dense {dense:.2f})."))


def latency_weight_line(data: dict) -> str:
    """The README's messages line: --latency-weight against none at N=4 r=0.1, at the longest length both ran."""
    g = groups(data.get(LONG) or [])
    lw = sorted((k for k in g if k[:3] == (4, 0.1, "global") and "latency weight" in k[3]
                 and (4, 0.1, "global", "lasso", k[4]) in g), key=lambda k: k[4])
    if not lw:
        return "No run of the long protocol with --latency-weight yet (results/cifar10_selection_long.json)."
    k = lw[-1]
    a, b = g[k], g[(4, 0.1, "global", "lasso", k[4])]
    d = mean_std([e["top1"] for e in a])[0] - mean_std([e["top1"] for e in b])[0]
    return (f"N=4, r=0.1, {k[4]}k training images seen (the long protocol): {k[3]} {profile(a)} against lasso "
            f"{profile(b)}: {d:+.2f} points.")


def page_section(data: dict) -> str:
    """docs/selection.md's generated section: the table, the targets, the plot."""
    dense = dense_top1(data)
    g = groups(data.get(LONG) or [])
    lines = [table(data), "", f"Targets (issue 32; dense {'-' if dense is None else f'{dense:.2f}'}, "
             f"mean of {SEEDS} seeds):", ""]
    if dense is None:
        lines.append("- No dense entry in results/cifar10_resnet.json: no target can be judged.")
    else:
        lines += [joint_target(g, dense, sel) for sel in sorted({k[3] for k in g if k[:3] == (2, 0.2, "joint")},
                                                                 key=lambda s: (s != "lasso", s))]
        lines += [global_target(g, dense), lasso_target(g), caps_ways(g)]
    if g:
        lines += ["", "![top-1 against images seen](../results/cifar10_selection_long.png)"]
    return "\n".join(lines)


def tune_screen(data: dict) -> str:
    """The settings screen (``long.py --tune``): the joint budget at N=2 r=0.2, 100k images, seed 0, one setting
    changed at a time, judged on the validation split only; the protocol's own row is its seed-0 run at 100k."""
    screen = data.get(TUNE) or []
    base = [e for e in data.get(LONG) or [] if (e["nodes"], e["target_ratio"], e["budget"], e["selection"],
                                                 e.get("lasso_weight"), length_k(e)) == (2, 0.2, "joint", "lasso",
                                                                                          "bytes", 100)]
    ref = next((e for e in base if e["seed"] == 0), None)
    if ref is None or not screen:
        return "No run of the settings screen yet (`python recipes/selection/long.py --tune`)."
    spread = mean_std([e["val_top1"] for e in base])[1] if len(base) > 1 else None
    rows = [[e.get("setting") or "protocol", f"{e['val_top1']:.2f}", f"{e['val_top1'] - ref['val_top1']:+.2f}",
             f"{e['top1']:.2f}"] for e in [ref, *sorted(screen, key=lambda e: -e["val_top1"])]]
    best = max(screen, key=lambda e: e["val_top1"])
    gain = best["val_top1"] - ref["val_top1"]
    noise = f" (the protocol's seeds spread {spread:.2f} on the validation split)" if spread is not None else ""
    so_far = f"So far ({len(screen)} of {TUNE_SETTINGS} settings screened): " if len(screen) < TUNE_SETTINGS else ""
    head = so_far + "best" if so_far else "Best"
    verdict = (head + f" on the validation split: `{best['setting']}`, {gain:+.2f} points against the protocol's "
               f"settings{noise}: " + ("more than the seeds' spread, a candidate for the 3-seed runs at 250k."
                                       if spread is not None and gain > spread else
                                       "within the seeds' spread, so the protocol's settings stand."))
    g = groups(data.get(LONG) or [])
    tried, proto = g.get((2, 0.2, "joint", f"lasso, {best['setting']}", 250)), g.get((2, 0.2, "joint", "lasso", 250))
    if tried and proto:
        d = mean_std([e["top1"] for e in tried])[0] - mean_std([e["top1"] for e in proto])[0]
        verdict += (f" At 250k images seen it gave {_ms(tried)} on the test split against the protocol's {_ms(proto)} "
                    f"({d:+.2f}; validation {mean_std([e['val_top1'] for e in tried])[0]:.2f} against "
                    f"{mean_std([e['val_top1'] for e in proto])[0]:.2f}).")
    return "\n".join([md_table(rows, ["setting changed", "validation top-1", "vs protocol",
                                      "test top-1 (not used to choose)"]), "", verdict])


def plot(data: dict, path: Path) -> None:
    """Top-1 against images seen: mean +- std per setting (runs as dots), the dense model as a line."""
    from .plots import pyplot, save

    g = groups(data.get(LONG) or [])
    if not g:
        return
    fig, ax = pyplot().subplots(figsize=(6.5, 4.2))
    for i, setting in enumerate(sorted({k[:4] for k in g}, key=lambda s: (s[0], -s[1], s[2], s[3]))):
        keys = sorted((k for k in g if k[:4] == setting), key=lambda k: k[4])
        shift = 1 + 0.03 * (i - 1)  # settings at one length side by side (log axis)
        xs = [k[4] * 1000 * shift for k in keys]
        stats = [mean_std([e["top1"] for e in g[k]]) for k in keys]
        n, r, budget, sel = setting
        ax.errorbar(xs, [m for m, _ in stats], yerr=[s for _, s in stats], fmt="o-", capsize=4, color=f"C{i}",
                    label=f"N={n} r={r:g}, {budget} budget, {sel}")
        for x, k in zip(xs, keys, strict=True):
            ax.scatter([x] * len(g[k]), [e["top1"] for e in g[k]], s=8, color=f"C{i}", alpha=0.5)
    dense = dense_top1(data)
    if dense is not None:
        ax.axhline(dense, color="k", ls="--", lw=1, label=f"dense, one device ({dense:.2f})")
    ax.set_xscale("log")
    ax.set_xlim(7e3, 3.5e5)
    ax.set_xticks([k * 1000 for k in CURVE_LENGTHS], [f"{k}k" for k in CURVE_LENGTHS])
    ax.set_xlabel("training images seen while sparsifying and fine-tuning")
    ax.set_ylabel("CIFAR-10 top-1 (%)")
    ax.set_title("CIFAR ResNet-20, long protocol (mean +- std over seeds; dots: runs)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save(fig, path)


PROFILE = "paper_profile"


def paper_profile(data: dict) -> str:
    """results/paper_profile.json: the triple (traffic, FLOPs, weights per node) of each counted model, with the
    accuracy where there is one, and what part of the paper's claim it reproduces."""
    rows = data.get(PROFILE) or []
    dense = dense_top1(data)
    cols = ["model", "N", "r", "traffic / dense", "FLOPs / dense", "weights per node / dense", "top-1",
            "vs dense"]
    out = [[e["name"], e["nodes"], f"{e['ratio']:.3f}", f"1/{e['traffic_reduction']:.1f}", f"{e['flops_share']:.2f}",
            f"{e['weights_per_node_share']:.2f}", "-" if e["top1"] is None else f"{e['top1']:.2f}",
            "-" if e["top1"] is None or dense is None else f"{e['top1'] - dense:+.2f}"] for e in rows]
    cifar = [e for e in rows if e["top1"] is not None and "lassojoint" not in e["name"]]
    text = [md_table(out, cols), ""]
    if cifar and dense is not None:
        m, sd = mean_std([e["top1"] for e in cifar])
        e = cifar[0]
        text.append(
            f"Reproduced: the paper's profile on CIFAR ResNet-20 at N=2 (our length: 250k images seen): "
            f"{e['traffic_reduction']:.1f}x less traffic, {e['flops_share']:.2f}x the FLOPs, "
            f"{e['weights_per_node_share']:.2f}x the weights per node, at {m:.2f} +- {sd:.2f} top-1 "
            f"({m - dense:+.2f} points against dense {dense:.2f}; {len(cifar)} seeds). Not reproduced: the paper's "
            "ImageNet ResNet-50 accuracy; for ResNet-50 the table counts the profile of the same setting "
            "(`disco cost resnet50 --nodes 2 --ratio 0.2 --budget joint`) and claims no accuracy.")
    return "\n".join(text)
