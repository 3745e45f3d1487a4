"""End to end through the command line on a tiny CIFAR-10 in torchvision's layout."""

import json
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from disco.cli import main


@pytest.fixture(scope="module")
def tiny_cifar(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar") / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = rng.integers(0, 10, 16)
        data = rng.integers(0, 255, (16, 3 * 32 * 32), dtype=np.uint8)
        data[:, :1024] = (labels[:, None] * 25).astype(np.uint8)  # a learnable cue in the red plane
        with open(root / name, "wb") as f:
            pickle.dump({"data": data, "labels": labels.tolist()}, f)
    return root.parent


def _json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_cost_json_torchvision(capsys):
    assert main(["cost", "resnet18", "--nodes", "2", "--ratio", "0.2", "--input-shape", "1,3,64,64", "--json"]) == 0
    d = _json(capsys)
    for k in ("nodes", "ratio", "dense_bytes", "bytes", "flops_total", "flops_per_node", "params_per_node",
              "params_dense"):
        assert k in d
    assert d["nodes"] == 2 and abs(d["ratio"] - 0.2) <= 0.01 and len(d["params_per_node"]) == 2


def test_cost_table_registered(capsys):
    assert main(["cost", "cifar_resnet8", "--nodes", "3", "--ratio", "0.1", "--input-shape", "1,3,32,32"]) == 0
    out = capsys.readouterr().out
    assert "layer1.0.conv1" in out
    assert re.search(r"ratio r = 0\.(09|10)\d\d", out)


def test_train_sparsify_eval_cost(tiny_cifar, tmp_path, capsys):
    dense = tmp_path / "dense.safetensors"
    assert main(["train", "--data", str(tiny_cifar), "--model", "cifar_resnet8", "--epochs", "1",
                 "--batch-size", "16", "--out", str(dense)]) == 0
    d = _json(capsys)
    assert main(["eval", str(dense), "--data", str(tiny_cifar), "--json"]) == 0
    ev = _json(capsys)  # the checkpoint written is the model train evaluated: same test split, same top-1
    assert ev["top1"] == pytest.approx(d["top1"], abs=1e-9) and ev["n"] == 16
    assert d["top1"] * 16 / 100 == pytest.approx(round(d["top1"] * 16 / 100))  # a count of 16 test images
    sp = tmp_path / "n2_r02.safetensors"
    assert main(["sparsify", str(dense), "--data", str(tiny_cifar), "--nodes", "2", "--ratio", "0.2",
                 "--epochs", "1", "--batch-size", "16", "--distill", "0.5", "--out", str(sp)]) == 0
    s = _json(capsys)
    assert abs(s["ratio"] - 0.2) <= 0.01 and s["nodes"] == 2
    assert main(["eval", str(sp), "--data", str(tiny_cifar), "--json"]) == 0
    e = _json(capsys)
    assert e["top1"] == pytest.approx(s["top1"], abs=1e-9)
    assert main(["cost", str(sp), "--json"]) == 0
    c = _json(capsys)
    assert c["bytes"] == s["bytes"] and c["nodes"] == 2
    assert main(["cost", str(sp), "--nodes", "4"]) == 2  # another N: refused
    assert "N=2" in capsys.readouterr().err


def test_sparsify_resumes(tiny_cifar, tmp_path, capsys):
    dense = tmp_path / "dense.safetensors"
    main(["train", "--data", str(tiny_cifar), "--model", "cifar_resnet8", "--epochs", "1", "--batch-size", "32",
          "--out", str(dense)])
    out = tmp_path / "r.safetensors"
    args = ["sparsify", str(dense), "--data", str(tiny_cifar), "--ratio", "0.1", "--batch-size", "32",
            "--selection", "taylor", "--out", str(out)]
    assert main(args + ["--epochs", "1"]) == 0
    state = out.with_name(out.name + ".state.pt")
    assert state.is_file()
    import torch

    assert torch.load(state, weights_only=False)["epoch"] == 1
    out.unlink()
    assert main(args + ["--epochs", "2"]) == 0  # picks up after epoch 1
    assert torch.load(state, weights_only=False)["epoch"] == 2
    assert len(torch.load(state, weights_only=False)["history"]) == 2


def test_errors_are_clear(tmp_path, capsys):
    assert main(["cost", "no_such_model", "--json"]) == 2
    assert "unknown model 'no_such_model'" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "none.safetensors"), "--data", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "o.safetensors"), "--epochs", "1"]) == 2
    assert "holds no CIFAR-10" in capsys.readouterr().err
    out = tmp_path / "new" / "o.safetensors"  # a refused --data leaves no folder behind for --out
    assert main(["train", "--data", str(tmp_path / "none"), "--out", str(out), "--epochs", "1"]) == 2
    assert "holds no CIFAR-10" in capsys.readouterr().err and not out.parent.exists()


def test_console_script_entry_point():
    r = subprocess.run([sys.executable, "-m", "disco.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "sparsify" in r.stdout


@pytest.mark.dist
def test_export_and_run_a_sparsified_checkpoint(tiny_cifar, tmp_path, capsys):
    """The whole pipeline: train, sparsify, export, run as 2 processes; invariants 2 and 3 on the way."""
    dense = tmp_path / "dense.safetensors"
    main(["train", "--data", str(tiny_cifar), "--model", "cifar_resnet8", "--epochs", "1", "--batch-size", "32",
          "--out", str(dense)])
    sp = tmp_path / "sp.safetensors"
    assert main(["sparsify", str(dense), "--data", str(tiny_cifar), "--ratio", "0.2", "--epochs", "1",
                 "--batch-size", "32", "--out", str(sp)]) == 0
    s = _json(capsys)
    out = tmp_path / "export"
    assert main(["export", str(sp), "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--nodes", "2", "--iters", "3", "--warmup", "1", "--data", str(tiny_cifar),
                 "--json"]) == 0
    r = _json(capsys)
    assert r["max_rel_err_vs_single_process"] < 1e-4
    assert r["bytes_sent_total"] == r["bytes_predicted"] == s["bytes"]
    assert r["data"]["n"] == 16 and r["data"]["top1"] == pytest.approx(s["top1"])  # same predictions
    assert main(["cost", str(sp), "--json"]) == 0  # the cost model counts the messages the run sends
    assert _json(capsys)["messages_per_inference"] == r["messages_per_inference"] > 2
    import disco

    seen: list[tuple[int, int]] = []  # progress of the test split (disco run --data shows it as a bar)
    disco.run(out, 2, data=str(tiny_cifar), iters=1, warmup=0, progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1] > 0, seen
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False)), seen


@pytest.mark.dist
def test_demo_json(capsys):
    """The README's main command: split, check invariant 1, cost, run as processes, compare."""
    assert main(["demo", "--iters", "3", "--json"]) == 0
    d = _json(capsys)
    assert d["invariant1_rel_err"] < 1e-5
    assert d["max_rel_err_vs_single_process"] < 1e-4
    assert d["bytes_sent_total"] == d["bytes"] and abs(d["ratio"] - 0.2) <= 0.01
    # the emulated link bounds the dense split from below: each node's uplink carries its half of the dense
    # bytes at 100 Mbit/s (pacing), whatever the compute
    floor_ms = d["dense_bytes"] / d["nodes"] * 8 / 100e6 * 1e3
    assert d["latency_ms"]["dense"]["100mbit"] >= 0.95 * floor_ms
    assert d["latency_ms"]["disco"]["100mbit"] >= 0.95 * floor_ms * d["ratio"]


def test_seed_governs_data_order_and_results(tiny_cifar, tmp_path, capsys):
    """--seed reaches the data loader (order and augmentation): one seed twice is identical, two seeds differ."""
    from disco.loading import load
    from disco.tasks import get_task

    def first_batches(seed):
        train, _ = get_task("cifar10").loaders(str(tiny_cifar), 8, seed=seed)
        return [(x.clone(), y.clone()) for x, y in train][:3]

    a, a2, b = first_batches(1), first_batches(1), first_batches(2)
    assert all(torch.equal(x, x2) and torch.equal(y, y2) for (x, y), (x2, y2) in zip(a, a2, strict=True))
    assert any(not torch.equal(y, yb) for (_, y), (_, yb) in zip(a, b, strict=True))

    dense = tmp_path / "dense.safetensors"
    assert main(["train", "--data", str(tiny_cifar), "--model", "cifar_resnet8", "--epochs", "1",
                 "--batch-size", "16", "--out", str(dense)]) == 0

    def run(seed, name):
        out = tmp_path / f"{name}.safetensors"
        assert main(["sparsify", str(dense), "--data", str(tiny_cifar), "--ratio", "0.2", "--epochs", "1",
                     "--batch-size", "16", "--selection", "magnitude", "--seed", str(seed), "--out", str(out)]) == 0
        capsys.readouterr()
        loaded = load(out)
        return loaded.ckpt.info["history"][0]["loss"], loaded.model.plain_state_dict()

    (l1, w1), (l1b, w1b), (l2, w2) = run(1, "s1"), run(1, "s1b"), run(2, "s2")
    assert l1 == l1b and all(torch.equal(w1[k], w1b[k]) for k in w1)
    assert l1 != l2 and any(not torch.equal(w1[k], w2[k]) for k in w1)


def test_train_subset_is_fixed_per_seed(tiny_cifar):
    from disco.tasks import get_task

    def labels(seed):
        train, _ = get_task("cifar10").loaders(str(tiny_cifar), 100, seed=seed)
        return sorted(train.restrict(20, seed).y.tolist()), len(train)

    assert labels(3) == labels(3) and labels(3) != labels(4) and labels(3)[1] == 1
    with pytest.raises(ValueError, match="subset of 100 images"):
        get_task("cifar10").loaders(str(tiny_cifar), 8)[0].restrict(100, 0)


@pytest.mark.slow
def test_joint_budget_resnet50_paper_profile(capsys):
    """The joint budget reaches the paper's ResNet-50 N=2 profile: r = 0.2, FLOPs <= 0.55x, weights/node <= 0.30x."""
    assert main(["cost", "resnet50", "--nodes", "2", "--ratio", "0.2", "--budget", "joint",
                 "--input-shape", "1,3,224,224", "--json"]) == 0
    d = _json(capsys)
    assert abs(d["ratio"] - 0.2) <= 0.01
    assert d["flops_total"] <= 0.55 * d["flops_dense"]
    assert max(d["params_per_node"]) <= 0.30 * d["params_dense"]


def test_joint_budget_refuses_caps_below_the_floor(capsys):
    assert main(["cost", "cifar_resnet8", "--ratio", "0.2", "--budget", "joint", "--max-flops", "0.3",
                 "--input-shape", "1,3,32,32"]) == 2
    assert "cannot be met by any choice of links" in capsys.readouterr().err


def test_export_model_name_latency_weight(tmp_path, capsys):
    """disco export MODEL --latency-weight: the same bytes budget in fewer messages (as `disco cost` counts them);
    a checkpoint brings its own links and refuses the option."""
    from disco.checkpoint import unpack_bits
    from disco.cost import estimate
    from disco.runtime.export import meta_partition

    msgs, ratios = [], []
    for lw in ("0", "100000"):
        out = tmp_path / f"lw{lw}"
        assert main(["export", "cifar_resnet8", "--nodes", "3", "--ratio", "0.2", "--latency-weight", lw,
                     "--out", str(out), "--json"]) == 0
        man = json.loads((out / "manifest.json").read_text())
        rep = estimate(meta_partition(man), unpack_bits(man["kept"], man["n_links"]))
        msgs.append(rep.messages_per_inference)
        ratios.append(rep.ratio)
        assert abs(rep.ratio - man["ratio"]) < 1e-9
    assert msgs[1] < msgs[0], msgs
    assert abs(ratios[0] - 0.2) < 0.02 and abs(ratios[1] - 0.2) < 0.02, ratios
    source = json.loads((tmp_path / "lw100000" / "manifest.json").read_text())["info"]["source"]
    assert "latency weight 100000" in source
    ckpt = tmp_path / "c.safetensors"
    ckpt.write_bytes(b"")
    assert main(["export", str(ckpt), "--latency-weight", "10", "--out", str(tmp_path / "x")]) == 2
    assert "--latency-weight are for a model name" in capsys.readouterr().err


def test_export_model_name_joint_budget_holds_the_caps(tmp_path):
    """disco export MODEL --budget joint: the exported links meet the FLOPs and per-node weight caps that
    `disco cost` checks (the profile the edge benchmark runs)."""
    from disco.checkpoint import unpack_bits
    from disco.cost import estimate
    from disco.runtime.export import meta_partition

    out = tmp_path / "joint"
    assert main(["export", "cifar_resnet8", "--nodes", "2", "--ratio", "0.2", "--budget", "joint",
                 "--max-flops", "0.6", "--max-weights-per-node", "0.35", "--out", str(out), "--json"]) == 0
    man = json.loads((out / "manifest.json").read_text())
    rep = estimate(meta_partition(man), unpack_bits(man["kept"], man["n_links"]))
    assert rep.flops_total <= 0.6 * rep.flops_dense + 1 and max(rep.params_per_node) <= 0.35 * rep.params_dense + 1
    assert 0 < rep.ratio <= 0.2 + 1e-9 and "joint budget" in man["info"]["source"]
