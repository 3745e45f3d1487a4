"""The recipes' shared driver (recipes/common.py), their run rows and the entries they write."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "recipes"))
sys.path.insert(0, str(ROOT))  # recipes.pages
import common  # noqa: E402
from common import Recipe, Run, run_config  # noqa: E402

from disco import SparsifyConfig  # noqa: E402


def _module(path: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(Path(path).parent.name + "_run", ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _recipe(**kw) -> Recipe:
    base = dict(task="cifar10", model="cifar_resnet8", input_shape=(1, 3, 32, 32), runs=[],
                metrics=lambda r: {"top1": r["top1"]}, dense_epochs=3, epochs=20, distill=0.5,
                finetune={"lr": 5e-4, "batch_size": 16})
    return Recipe(**(base | kw))


def test_a_run_row_overrides_the_recipe_and_makes_a_valid_config():
    rec = _recipe()
    cfg = run_config(rec, Run("x", 4, 0.1, epochs=60, selection="taylor", lr=1e-3, distill=0.0))
    assert cfg == {"lr": 1e-3, "batch_size": 16, "nodes": 4, "ratio": 0.1, "budget": "global", "selection": "taylor",
                   "epochs": 60, "distill": 0.0, "limit": None}
    plain = run_config(rec, Run("y", 2, 0.2, budget="layer"))
    assert (plain["lr"], plain["epochs"], plain["distill"], plain["budget"]) == (5e-4, 20, 0.5, "layer")
    SparsifyConfig(**cfg)  # every key is a field of the config


@pytest.mark.parametrize("path", ["recipes/cifar10/run.py", "recipes/seg/run.py", "recipes/sr/run.py",
                                  "recipes/det/run.py", "recipes/det/lr_sweep.py"])
def test_every_recipe_row_makes_a_valid_config_and_names_are_unique(path):
    mod = _module(path)
    if hasattr(mod, "recipes_of"):
        recipes = [r for r, _ in mod.recipes_of(mod.build_parser().parse_args([]))]
    elif hasattr(mod, "recipe_of"):
        recipes = [mod.recipe_of(mod.build_parser().parse_args([]))]
    else:
        recipes = [_recipe(runs=mod.ROWS)]
    for rec in recipes:
        names = [r.name for r in rec.runs]
        assert len(names) == len(set(names)) and names
        for run in rec.runs:
            SparsifyConfig(**run_config(rec, run))


# the results file each recipe writes, and how to build its recipe from the default options
RESULTS = [("recipes/cifar10/run.py", "cifar10_resnet", []), ("recipes/cifar10/run.py", "cifar10_vit",
                                                                 ["--model", "vit_cifar"]),
           ("recipes/seg/run.py", "seg_deeplabv3plus", []), ("recipes/sr/run.py", "sr_rrdbnet", []),
           ("recipes/det/run.py", "det_ssd", []), ("recipes/det/run.py", "det_ssd_small",
                                                  ["--model", "ssd_small_split"])]


@pytest.mark.parametrize("path,name,argv", RESULTS, ids=[r[1] for r in RESULTS])
def test_a_rerun_writes_at_least_the_fields_of_the_committed_results(path, name, argv):
    """The tables are generated from these fields: the driver's entries must carry every one of them."""
    mod = _module(path)
    args = mod.build_parser().parse_args(argv)
    rec = mod.recipes_of(args)[0][0] if hasattr(mod, "recipes_of") else mod.recipe_of(args)
    committed = json.loads((ROOT / "results" / f"{name}.json").read_text())
    res = {k: v for e in committed for k, v in e.items()}  # every field a committed entry has, as a task result
    if "per_class_iou" in res:
        res |= {f"iou_{c}": 1.0 for c in res["per_class_iou"]}
    dense = common.dense_entry(rec, res, {"dense_bytes": 1, "flops_dense": 2, "params_dense": 3})
    run = common.run_entry(rec, {**res, "name": "n2_r0.1"})
    for e in committed:
        built = dense if e["nodes"] == 1 else run
        missing = set(e) - set(built) - {"carried_over"}
        assert not missing, f"{e['name']}: a rerun would not write {sorted(missing)}"


def test_drive_skips_what_is_done_records_row_rates_and_copies_committed_checkpoints(tmp_path, monkeypatch):
    calls = []

    def fake_sparsify(dense, data, out, config):
        calls.append(config)
        Path(out).write_bytes(b"ckpt")
        return {"nodes": config.nodes, "ratio": config.ratio, "target_ratio": config.ratio, "budget": config.budget,
                "selection": config.selection, "top1": 50.0 + config.ratio, "bytes": 10, "dense_bytes": 100,
                "stats_bytes": 0, "flops_total": 5, "flops_dense": 9, "params_per_node": [1, 1], "params_dense": 2}

    runs, assets = tmp_path / "runs", tmp_path / "assets"
    runs.mkdir()
    (runs / "dense.safetensors").write_bytes(b"dense")
    monkeypatch.setattr(common, "dense_model", lambda rec, r, data, threads: (
        runs / "dense.safetensors", {"top1": 60.0}, {"dense_bytes": 100, "flops_dense": 9, "params_dense": 2}))
    import disco

    monkeypatch.setattr(disco, "sparsify_checkpoint", fake_sparsify)
    rec = _recipe(runs=[Run("a", 2, 0.1), Run("b", 2, 0.2, epochs=7, lr=1e-3)], committed={"a": "A.safetensors",
                                                                                          "dense": "D.safetensors"})
    args = common.argparse.Namespace(dense_threads=1, workers=1, only=["a"])
    entries = common.drive(rec, "DATA", runs, args, assets=assets)
    assert [e["name"] for e in entries] == ["dense", "a"] and len(calls) == 1  # --only
    assert entries[1]["checkpoint"].endswith("A.safetensors") and (assets / "A.safetensors").read_bytes() == b"ckpt"
    assert (assets / "D.safetensors").read_bytes() == b"dense" and entries[0]["top1"] == 60.0
    args.only = None
    entries = common.drive(rec, "DATA", runs, args, assets=None)
    assert [e["name"] for e in entries] == ["dense", "a", "b"] and len(calls) == 2  # a is done: skipped
    assert calls[1].lr == 1e-3 and calls[1].epochs == 7 and calls[0].lr == 5e-4 and calls[0].epochs == 20
    b = json.loads((runs / "b.json").read_text())
    assert b["lr"] == 1e-3 and b["epochs"] == 7 and entries[2]["lr"] == 1e-3 and entries[1]["lr"] == 5e-4


def test_sr_recipe_keeps_earlier_entries_only_for_the_same_dense_model(tmp_path):
    sr_run = _module("recipes/sr/run.py")
    dense = {"name": "dense", "psnr_set5": 30.5, "psnr_set14": 27.5, "psnr_bsd100": 26.9, "ssim_set5": 0.868,
             "ssim_set14": 0.75, "ssim_bsd100": 0.71}
    old = [dense, {"name": "n2_r0.5", "psnr_set5": 30.1}, {"name": "n2_r0.1", "psnr_set5": 29.0},
           {"name": "gone_row", "psnr_set5": 1.0}]
    path = tmp_path / "sr_rrdbnet.json"
    path.write_text(json.dumps(old))
    now = [{**dense, "ssim_set5": 0.868 + 1e-12}, {"name": "n2_r0.1", "psnr_set5": 29.4}]
    kept = sr_run.carried_over(path, now, ["n2_r0.5", "n2_r0.1"])
    assert [e["name"] for e in kept] == ["n2_r0.5"] and kept[0]["carried_over"] is True
    other = [{**dense, "psnr_set5": 30.6}, {"name": "n2_r0.1", "psnr_set5": 29.4}]
    assert sr_run.carried_over(path, other, ["n2_r0.5", "n2_r0.1"]) == []
    assert sr_run.carried_over(tmp_path / "missing.json", now, ["n2_r0.5"]) == []


def test_sweeps_group_runs_by_setting_with_their_separated_branches():
    from recipes.pages.runs import sweeps

    def run(name, n, r, sel, ep, lr=None):
        return {"name": name, "nodes": n, "ratio": r, "selection": sel, "epochs": ep, "lr": lr}

    entries = [{"name": "dense", "nodes": 1, "ratio": 1.0, "selection": "dense", "epochs": 300}]
    entries += [run(f"m{r}", 2, r, "magnitude", 20) for r in (0.5, 0.2, 0.1)]
    entries += [run("m_sep", 2, 0.0, "separated", 20), run("m4", 4, 0.1, "magnitude", 20)]
    entries += [run(f"t{r}", 2, r, "taylor", 60, 1e-3) for r in (0.5, 0.2, 0.1)]
    entries += [run("t_sep", 2, 0.0, "separated", 60, 1e-3), run("t_sep_other_lr", 2, 0.0, "separated", 60)]
    entries += [run("t20", 2, 0.1, "taylor", 20), run("m300", 2, 0.1, "magnitude", 300, 1e-3)]  # extra points
    got = {k: sorted(e["name"] for e in v) for k, v in sweeps(entries).items()}
    assert got == {("magnitude", 20, None): ["m0.1", "m0.2", "m0.5", "m4", "m_sep"],
                   ("taylor", 60, 1e-3): ["t0.1", "t0.2", "t0.5", "t_sep"]}


def test_separated_for_prefers_the_same_length_and_rate():
    from recipes.pages.runs import separated_for

    seps = [{"epochs": 20, "lr": None}, {"epochs": 60, "lr": 1e-3}, {"epochs": 60, "lr": None},
            {"epochs": 300, "lr": None}]
    assert separated_for({"epochs": 60, "lr": None}, seps) is seps[2]  # same length and rate
    assert separated_for({"epochs": 60, "lr": 2e-3}, seps) is seps[1]  # same length, first of them
    assert separated_for({"epochs": 100}, seps) is seps[1]  # the longest-tuned shorter one
    assert separated_for({"epochs": 10}, seps) is seps[0]  # none shorter: the shortest
    assert separated_for({"epochs": 10}, []) is None


def test_long_sweep_keeps_the_recorded_results_on_a_machine_without_its_runs(tmp_path):
    """The result file is the long protocol's record: a fresh runs/ folder neither drops nor reruns its entries."""
    long = _module("recipes/selection/long.py")
    name, cfg = long.rows()[0]
    old = {k: None for k in long.FIELDS} | {"name": name, "budget": "joint", "selection": "lasso", "nodes": 2,
                                             "seed": 0, "lasso_weight": "bytes", "latency_weight": 0.0, "top1": 80.0}
    result, runs = tmp_path / "result.json", tmp_path / "runs"
    result.write_text(json.dumps([old]))
    runs.mkdir()
    new = {k: v for k, v in old.items() if k != "setting"} | {"name": "other", "seed": 1, "top1": 81.0}
    (runs / "other.json").write_text(json.dumps(new))
    long.collect(runs, result)
    got = {e["name"]: e for e in json.loads(result.read_text())}
    assert got[name]["top1"] == 80.0 and got["other"]["top1"] == 81.0 and got["other"]["setting"] == "protocol"
    assert long.done(runs, result) == {name, "other"}
    assert all(c.get("train_images") for _, c in long.rows())
    assert len({n for n, _ in long.rows()}) == len(long.rows())


def test_architectures_redraws_only_all_zero_weights_for_the_onnx_proof(tmp_path, monkeypatch):
    import torch

    import disco.models

    arch = _module("recipes/architectures/run.py")

    def model(name: str) -> torch.nn.Module:
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        torch.nn.init.zeros_(m[1].weight)  # a zero-initialised head
        torch.nn.init.zeros_(m[1].bias)
        return m

    monkeypatch.setattr(disco.models, "build_model", model)
    path = tmp_path / "w.pt"
    assert arch.redrawn_weights("tiny", path) == 1
    torch.manual_seed(0)  # as redrawn_weights builds it
    state, ref = torch.load(path, weights_only=True), model("tiny").state_dict()
    assert state["1.weight"].abs().sum() > 0 and torch.equal(state["1.bias"], ref["1.bias"])  # biases stay
    assert torch.equal(state["0.weight"], ref["0.weight"])  # weights that were not all zero stay


def test_edge_page_states_each_floor_beside_its_target():
    """recipes/pages/edge.py: with bench/floor.py's entries, the memory and speed targets it bounds gain a floor
    line with its figure; without them, none."""
    from recipes.pages.edge import targets

    def split(engine, ratio, budget, bw="none", codec="fp32", ms=100.0, rss=100.0):
        return {"model": "resnet50", "what": "split", "engine": engine, "nodes": 2, "target_ratio": ratio,
                "budget": budget, "bandwidth": bw, "codec": codec, "latency_ms_median": ms,
                "peak_rss_mb_per_node": [rss, rss], "weight_bytes_per_node": [2**20] * 2}

    entries = [{"model": "resnet50", "what": "single", "engine": "onnx", "latency_ms_median": 50.0,
                "peak_rss_mb": 180.0},
               split("onnx", 0.2, "joint"), split("onnx", 0.2, "global"), split("torch", 0.2, "global"),
               split("onnx", 0.2, "global", "1gbit", "fp16", 45.0), split("torch", 0.2, "global", "1gbit", "fp16"),
               split("onnx", 1.0, "global", "100mbit", ms=1600.0), split("onnx", 0.2, "global", "100mbit", ms=400.0)]

    def fl(ratio, budget, codec="fp32", **ms):
        return {"model": "resnet50", "nodes": 2, "target_ratio": ratio, "budget": budget, "codec": codec,
                "ranks": [{"rss_loaded_mb": 93.0}, {"rss_loaded_mb": 94.0}], "floor_ms": ms}

    floors = [fl(0.2, "joint"), fl(0.2, "global", "fp16", **{"1gbit": 44.0}), fl(1.0, "global", **{"100mbit": 1500.0}),
              fl(0.2, "global", **{"100mbit": 300.0})]
    lines = targets(entries, None, None, floors)
    got = [ln for ln in lines if "floor:" in ln]
    assert len(got) == 3 and "93 MB (0.517x)" in got[0] and "44.0 ms (0.88x" in got[1] and "5.00x" in got[2], got
    assert not [ln for ln in targets(entries, None, None, None) if "floor:" in ln]
