"""docs/architectures.md from results/architectures.json (written by recipes/architectures/run.py)."""

from __future__ import annotations

from .md import md_table

COLUMNS = ["model", "source", "input", "partitions", "dense MB", "r", "max rel. error", "bytes sent = predicted",
           "result", "ONNX engine"]
HOW = ("How an architecture is split, or refused: every op of the traced graph needs a rule (`disco.graph`); a "
       "module type's rule covers a subclass only when the subclass keeps the forward, so a subclass that "
       "computes something else (timm's `StdConv2d` standardises its weights) is refused by name instead of "
       "being split as a plain convolution. Every export runs the node plans on a probe input against the "
       "model's own forward and refuses to write a split that differs by more than 1e-4, naming the first op "
       "where they part; `disco run` exits 3 when its measured error exceeds `--max-rel-err` (1e-4). Channels "
       "that reach a mixing op through channel-local ops after a concatenation, or through an upsampling, are "
       "sent before those ops and the receiver applies them (exchange placement: densenet121 moves each "
       "concatenated channel once).")
PLACEMENT = ("Dense bytes per image (r = 1) with each channel sent after the channel-local ops that follow a "
             "concatenation or an upsampling (the sender applies them, and the channel crosses again for every "
             "later consumer) and before them (the receiver applies them, the default). `python "
             "recipes/architectures/placement.py` writes `results/placement.json`; `python -m recipes.pages` "
             "fills the table:")


def _row(e: dict) -> list[object]:
    if not e.get("partitions", False) or not e.get("exports", True):
        why = e.get("refusal", "").replace("|", "\\|")
        dense = f"{e['dense_bytes'] / 1e6:.1f}" if e.get("partitions") else ""
        return [e["model"], e["source"], e["input_shape"], "yes" if e.get("partitions") else "no", dense, "", "", "",
                f"refused: `{why}`", ""]
    err = e.get("max_rel_err")
    same = e.get("bytes_sent_total") == e.get("bytes_predicted") and e.get("bytes_sent_total") is not None
    res = "ok" if e.get("ok") else f"FAILED: `{e.get('run_error', 'error above 1e-4 or bytes differ')}`"
    if e.get("proof", "output") != "output":
        proved = e.get("proof_max_rel_err")
        res += f" (constant output: the export proved the split on {e['proof']}" + (
            f", max rel. error {proved:.1e})" if proved is not None else ")")
    return [e["model"], e["source"], e["input_shape"], "yes", f"{e['dense_bytes'] / 1e6:.1f}",
            f"{e.get('ratio', float('nan')):.3f}",
            "n/a" if err is None else f"{err:.1e}", f"{'yes' if same else 'no'} ({e.get('bytes_sent_total')})", res,
            _onnx(e)]


def _onnx(e: dict) -> str:
    """The ONNX engine's cell: its error and the bytes check, a failure's reason, or not run yet."""
    if "onnx_ok" not in e:
        return "not run yet"
    if e.get("onnx_error"):
        why = "refused" if e.get("onnx_exit_code") == 2 else "FAILED"
        return f"{why}: `" + e["onnx_error"].replace("|", "\\|") + "`"
    redrawn = " (zero-initialised weights redrawn: a constant output proves nothing)" if e.get("onnx_weights") else ""
    return (f"{'ok' if e['onnx_ok'] else 'FAILED'}: {e['onnx_max_rel_err']:.1e}, bytes {e['onnx_bytes_sent_total']}"
            + redrawn)


HYBRIDS = (
    "Random weights, each model at its own input size, r = 0.2 (links by magnitude), N = 2 and N = 3, both "
    "engines (`python recipes/architectures/hybrids.py` writes `results/architectures_hybrids.json`). A cell: "
    "the largest relative error of `disco run` against the single-process model, and the bytes sent, which must "
    "equal the cost model's prediction (`ok`). Heads split by `view`/`reshape` + `permute` are followed as data "
    "(a head's q, k, v and output channels on one node), constants made in forward are held whole by every node, "
    "branches on the input's shape are resolved for the export's shape. *Dense bytes*: dense within-layer "
    "parallelism per image (`disco cost --ratio 1`) against an independent count from the model's own forward "
    "(every linear and convolution intercepted, each distinct non-constant input counted once, x (N - 1)); "
    "where they differ, the hooks count a channel that a convolution reads again through a concatenation as a "
    "new tensor (MobileViT's fusion convolution reads each block's input through `torch.cat`), which the split "
    "sends once (DESIGN.md: links); and they count every node as a reader of every attention's input, while a "
    "head is never split: with fewer heads than nodes (MaxViT's first stage has 2 heads, at N = 3) a node runs "
    "no head of that attention and receives nothing for it.")


def _split_cell(s: dict | None) -> str:
    if not s:
        return "not run"
    if s.get("error"):
        why = "refused" if s.get("exit_code") == 2 else "FAILED"
        return f"{why}: `" + s["error"].replace("|", "\\|") + "`"
    same = s["bytes_sent_total"] == s["bytes_predicted"]
    return f"{'ok' if s['ok'] else 'FAILED'}: {s['max_rel_err']:.1e}, bytes {s['bytes_sent_total']}" + (
        "" if same else f" (predicted {s['bytes_predicted']})")


def hybrids_table(entries: list[dict]) -> str:
    """One row per model: the four splits (engine x N), or the refusal; dense bytes against the hooks' count."""
    rows = []
    for e in entries:
        if not e.get("partitions"):
            why = e.get("refusal", "").replace("|", "\\|")
            rows.append([e["model"], e["source"], e["input_shape"], f"refused: `{why}`", "", "", "", "", ""])
            continue
        dense = "; ".join(f"N={n}: {e[f'dense_bytes_{n}'] / 1e6:.2f} / {e[f'hooked_dense_bytes_{n}'] / 1e6:.2f}"
                          + (" (equal)" if e[f"dense_bytes_{n}"] == e[f"hooked_dense_bytes_{n}"] else "")
                          for n in (2, 3) if f"dense_bytes_{n}" in e)
        cells = [_split_cell(e["splits"].get(k)) for k in ("torch/2", "torch/3", "onnx/2", "onnx/3")]
        rows.append([e["model"], e["source"], e["input_shape"], "ok" if e.get("ok") else "not all ok", *cells, dense])
    cols = ["model", "source", "input", "result", "torch N=2", "torch N=3", "ONNX N=2", "ONNX N=3",
            "dense MB: cost model / hooks"]
    return md_table(rows, cols)


def page(entries: list[dict]) -> str:
    """The whole page: how the models were tried, one row per model, then the placement table's marker."""
    first = entries[0] if entries else {"nodes": 2, "ratio_target": 0.2, "input_shape": "1,3,224,224"}
    n, r, shape = first["nodes"], first["ratio_target"], first["input_shape"]
    lines = [
        "# Architectures tried", "",
        "Generated by `python -m recipes.pages` from `results/architectures.json` (written by "
        "`recipes/architectures/run.py`; do not edit by hand).",
        f"Random weights, input {shape}, N={n}. *Dense MB*: bytes moved per image by dense within-layer "
        f"parallelism (`disco cost MODEL --nodes {n} --ratio 1`). Then `disco export MODEL --nodes {n} "
        f"--ratio {r}` (links by magnitude; the export is proved against the model's own forward) and "
        f"`disco run DIR --nodes {n} --json`: the split's largest relative error against the single-process "
        "model, and whether the bytes it sent equal the cost model's. *ONNX engine*: the same split exported with "
        "`--format onnx` and run by the torch-free engine (`recipes/architectures/run.py --engine onnx`).", "",
        HOW, "",
        md_table(map(_row, entries), COLUMNS),
        "", "## Edge hybrids: attention written out as tensor ops (issue 43)", "", HYBRIDS, "",
        "<!-- table:hybrids -->", "<!-- /table:hybrids -->",
        "", "## Exchange placement", "", PLACEMENT, "", "<!-- table:placement -->", "<!-- /table:placement -->"]
    return "\n".join(lines) + "\n"
