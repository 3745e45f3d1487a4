"""The recipes' shared run-table helpers (recipes/common.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
from common import epochs_of, options_of  # noqa: E402


def test_run_rows_with_optional_epochs_and_options():
    assert epochs_of(("n2_r0.1", 2, 0.1), 20) == 20
    assert epochs_of(("n2_r0.1_ft60", 2, 0.1, 60), 20) == 60
    assert epochs_of(("n2_r0.1_taylor", 2, 0.1, {"selection": "taylor"}), 20) == 20
    assert epochs_of(("x", 2, 0.1, 300, {"selection": "taylor"}), 20) == 300
    assert epochs_of(("cifar", 2, 0.1, "global", "magnitude", 30), 10, at=5) == 30
    assert options_of(("n2_r0.1", 2, 0.1)) == {}
    assert options_of(("n2_r0.1_ft60", 2, 0.1, 60)) == {}
    assert options_of(("x", 2, 0.1, 300, {"selection": "taylor"})) == {"selection": "taylor"}


def test_sr_recipe_keeps_earlier_entries_only_for_the_same_dense_model(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("sr_run", Path(__file__).resolve().parents[1] / "recipes/sr/run.py")
    sr_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sr_run)
    import json

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


def test_sparsify_run_puts_the_row_rate_last_records_it_and_caches(tmp_path, monkeypatch):
    import json

    import common

    calls = []

    def fake_disco(*args, threads):
        calls.append(args)
        (tmp_path / "x.safetensors").write_bytes(b"")
        return {"map": 1.0}

    monkeypatch.setattr(common, "disco", fake_disco)
    res = common.sparsify_run(tmp_path, tmp_path / "dense.safetensors", "DATA", "x", 2, 0.1, 10,
                              ["--lr", "0.0005", "--distill", "0.5"], selection="taylor", lr=1e-3)
    args = calls[0]
    assert args[args.index("--selection") + 1] == "taylor"
    assert [a for i, a in enumerate(args) if i and args[i - 1] == "--lr"][-1] == "0.001"  # argparse: last one wins
    assert res["lr"] == 1e-3 and json.loads((tmp_path / "x.json").read_text())["lr"] == 1e-3
    common.sparsify_run(tmp_path, tmp_path / "dense.safetensors", "DATA", "x", 2, 0.1, 10, [], lr=1e-3)
    assert len(calls) == 1  # cached: both files exist


def test_sweeps_group_runs_by_setting_with_their_separated_branches():
    from tables import sweeps

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
    from tables import separated_for

    seps = [{"epochs": 20, "lr": None}, {"epochs": 60, "lr": 1e-3}, {"epochs": 60, "lr": None},
            {"epochs": 300, "lr": None}]
    assert separated_for({"epochs": 60, "lr": None}, seps) is seps[2]  # same length and rate
    assert separated_for({"epochs": 60, "lr": 2e-3}, seps) is seps[1]  # same length, first of them
    assert separated_for({"epochs": 100}, seps) is seps[1]  # the longest-tuned shorter one
    assert separated_for({"epochs": 10}, seps) is seps[0]  # none shorter: the shortest
    assert separated_for({"epochs": 10}, []) is None
