"""README.md and docs/: short, generated from results/*.json by the one generator (``python -m recipes.pages``),
and every link leads somewhere."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from recipes.pages import registry, selection_long  # noqa: E402
from recipes.pages.__main__ import main as pages_main  # noqa: E402
from recipes.pages.md import md_table  # noqa: E402

PAGES = registry.pages(ROOT)
EXPECTED = registry.expected(ROOT)


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text())
    assert n < 15_000, f"README.md has {n} characters; move details to docs/"


@pytest.mark.parametrize("page", sorted(EXPECTED), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_is_what_the_generator_writes_from_the_committed_json(page):
    """Every whole page (written from its JSON) and every table block of every page is what the generator
    writes from results/*.json: no hand edit survives, no stale page."""
    assert page.read_text() == EXPECTED[page], (
        f"{page.relative_to(ROOT)} differs from what results/*.json give: run python -m recipes.pages")


def test_every_whole_page_and_every_block_is_covered():
    assert {ROOT / p for p in registry.WHOLE_PAGES} <= set(EXPECTED), "a whole page's JSON is missing"
    assert set(PAGES) <= set(EXPECTED) | {p for p in PAGES if not p.is_file()}
    assert not [n for n in registry.TABLES if n.endswith("_summary")], "no block restates old acceptance checks"


def test_check_mode_passes_on_the_committed_pages():
    assert pages_main(["--check", "--no-plots"]) == 0


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_links_and_pictures_exist(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target or target.startswith("../shared/") or target.startswith("../../shared/"):
            continue  # the web, and the shared data outside the repository
        assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to missing {target}"


def test_markers_are_known_and_filled():
    seen = set()
    for page in PAGES:
        for name, body in re.findall(r"<!-- table:(\w+) -->\n(.*?)<!-- /table:\1 -->", page.read_text(), re.S):
            assert name in registry.TABLES, f"{page.name}: unknown marker {name}"
            assert body.strip(), f"{page.name}: marker {name} is empty (its results JSON is missing?)"
            seen.add(name)
    assert {"headline", "latency_short", "cifar10_resnet", "latency", "selection_long"} <= seen


def test_md_table_writes_header_separator_rows_and_refuses_a_short_row():
    assert md_table([[1, "a"], ["", 2.5]], ["x", "y"]) == "| x | y |\n|---|---|\n| 1 | a |\n|  | 2.5 |"
    with pytest.raises(ValueError, match="row of 1 cells under 2 columns"):
        md_table([[1]], ["x", "y"])


def test_render_fills_a_marker_from_json_and_refuses_an_unknown_one(tmp_path):
    (tmp_path / "latency.json").write_text('{"entries": [{"model": "m", "nodes": 2, "bandwidth_mbit": 100, '
                                           '"shaping": "pacing", "codec": "fp32", "mode": "dense", "ratio": 1.0, '
                                           '"input_shape": [1, 3, 8, 8], "latency_ms_median": 50.0}, '
                                           '{"model": "m", "nodes": 2, "bandwidth_mbit": 100, "shaping": "pacing", '
                                           '"codec": "fp32", "mode": "disco", "ratio": 0.1, '
                                           '"input_shape": [1, 3, 8, 8], "latency_ms_median": 20.0}]}')
    out = registry.render("a\n<!-- table:latency_short -->\nold\n<!-- /table:latency_short -->\nb", tmp_path)
    assert "| m | 3x8x8 | 50 | - | 20 | - | 2.5x |" in out and "old" not in out
    kept = "<!-- table:sr_rrdbnet -->\nkept\n<!-- /table:sr_rrdbnet -->"  # its JSON is missing: left as it is
    assert registry.render(kept, tmp_path) == kept
    with pytest.raises(KeyError, match="unknown table marker"):
        registry.render("<!-- table:nope -->\n<!-- /table:nope -->", tmp_path)


# ---- issue 32's long protocol: synthetic entries (never committed as results) --------------------------------

def _run(budget: str, n: int, r: float, sel: str, k: int, seed: int, top1: float) -> dict:
    flops, weights = {"joint": (0.55, 0.26)}.get(budget, (0.70, 0.45))
    return {"name": f"n{n}_r{r}_{budget}_{sel}_i{k}k_s{seed}", "budget": budget, "selection": sel, "nodes": n,
            "ratio": r, "target_ratio": r, "seed": seed, "train_images_seen": k * 1000 - 168, "top1": top1,
            "val_top1": top1 + 2, "flops_total": flops * 1000, "flops_dense": 1000,
            "params_per_node": [weights * 100, 10], "params_dense": 100}


def _long(seeds: int = 3, joint: float = 85.5, lasso: float = 85.0) -> dict:
    runs = []
    for s in range(seeds):
        runs += [_run("joint", 2, 0.2, "lasso", 100, s, joint - 1.0 + 0.1 * s),
                 _run("joint", 2, 0.2, "lasso", 250, s, joint + 0.1 * s),
                 _run("global", 2, 0.2, "lasso", 250, s, 86.0 + 0.1 * s),
                 _run("global", 4, 0.1, "lasso", 250, s, lasso + 0.1 * s),
                 _run("global", 4, 0.1, "random", 250, s, 83.0 + 0.1 * s)]
    return {selection_long.LONG: runs, selection_long.DENSE: [{"name": "dense", "top1": 86.63}]}


def test_long_section_states_each_target_from_the_data():
    text = selection_long.page_section(_long())
    assert "| 2 | 0.2 | joint | lasso | 250k | 3 of 3 | 85.60 | 0.10 | -1.03 | 87.60 | 0.200 | 0.55 | 0.26 |" in text
    assert "| 2 | 0.2 | global | lasso | 10k | 0 of 3 | - |" in text  # a planned length not run yet
    joint, glob, lasso, ways = (ln for ln in text.splitlines() if ln.startswith("- "))
    assert "**not measured yet**" in ways and "(3 and 0 of 3 seeds done)" in ways
    assert "**not measured yet**" in joint and "Separated branches (N=2, r=0) at that length: not measured" in joint
    assert "At 250k images seen" in joint and "held" in joint  # 100k is 2.03 points under: 250k is judged
    assert "**met**" in glob and "-0.53 points" in glob
    assert "**met**" in lasso and "+2.00 points" in lasso
    assert "cifar10_selection_long.png" in text
    line = selection_long.budgets(_long())
    assert line.startswith("N=2, r=0.2, lasso selection, 250k training images seen") and "-0.50 points" in line
    assert "FLOPs 0.55x" in line and "(dense 86.63)" in line


def test_long_section_says_by_how_much_a_target_is_missed_and_gives_no_verdict_under_3_seeds():
    text = selection_long.page_section(_long(joint=84.0, lasso=83.5))
    joint, _, lasso, _ = (ln for ln in text.splitlines() if ln.startswith("- "))
    assert "**not met**" in joint and "1.03 points short of -1.5" in joint and "from 100k to 250k" in joint
    assert "**not met**" in lasso and "short by" in lasso
    few = selection_long.page_section(_long(seeds=2))
    assert few.count("no verdict yet") == 3 and "**met**" not in few and "**not met**" not in few
    empty = selection_long.page_section({selection_long.DENSE: [{"name": "dense", "top1": 86.63}]})
    assert empty.count("not measured yet") >= 3 and ".png" not in empty


def test_long_plot_is_written_from_the_json(tmp_path):
    for name, data in _long().items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    written = registry.write_plots(tmp_path, only=["cifar10_selection_long"])
    assert tmp_path / "cifar10_selection_long.png" in written
    assert (tmp_path / "cifar10_selection_long.png").stat().st_size > 10_000


def test_long_section_compares_the_two_ways_of_meeting_the_joint_caps():
    data = _long()
    for s in range(3):  # --lasso-weight joint: its own setting, judged against the caps like the default
        e = _run("joint", 2, 0.2, "lasso", 250, s, 86.0 + 0.1 * s)
        data[selection_long.LONG].append({**e, "lasso_weight": "joint", "name": e["name"] + "_rooms"})
    text = selection_long.page_section(data)
    lines = [ln for ln in text.splitlines() if ln.startswith("- ")]
    assert len(lines) == 5 and "(lasso, rooms-charged)" in lines[1] and "-0.53 points vs dense" in lines[1]
    assert "| 2 | 0.2 | joint | lasso, rooms-charged | 250k | 3 of 3 | 86.10 |" in text
    assert "85.60 +- 0.10 (3 seeds) against 86.10 +- 0.10 (3 seeds), +0.50 points" in lines[-1]
    assert "more than the two stds apart" in lines[-1]


def test_paper_profile_states_what_is_reproduced_from_the_data():
    row = {"nodes": 2, "ratio": 0.164, "traffic_reduction": 6.09, "flops_share": 0.55, "weights_per_node_share": 0.26}
    data = {selection_long.PROFILE: [{**row, "name": f"n2_joint_s{s}", "top1": 84.0 + 0.2 * s} for s in range(3)]
            + [{**row, "name": "resnet50", "traffic_reduction": 5.07, "top1": None}],
            selection_long.DENSE: [{"name": "dense", "top1": 86.0}]}
    text = selection_long.paper_profile(data)
    assert "| n2_joint_s1 | 2 | 0.164 | 1/6.1 | 0.55 | 0.26 | 84.20 | -1.80 |" in text
    assert "| resnet50 | 2 | 0.164 | 1/5.1 | 0.55 | 0.26 | - | - |" in text
    assert "at 84.20 +- 0.20 top-1 (-1.80 points against dense 86.00; 3 seeds)" in text
    assert "Not reproduced: the paper's ImageNet ResNet-50 accuracy" in text


def test_edge_section_states_the_memory_and_speed_targets_from_the_data():
    from recipes.pages import edge

    def split(engine, n, r, budget, bw, ms, rss, weights=10 * 2**20, codec="fp32"):
        return {"model": "resnet50", "what": "split", "engine": engine, "nodes": n, "target_ratio": r,
                "budget": budget, "bandwidth": bw, "codec": codec, "latency_ms_median": ms,
                "peak_rss_mb_per_node": [rss, rss - 1],
                "weight_bytes_per_node": [weights, weights], "torch_in_node": [engine == "torch"] * 2,
                "messages_per_inference": 10, "bytes_sent_total": 5000}

    entries = [{"model": "resnet50", "what": "single", "engine": "torch", "latency_ms_median": 100.0,
                "peak_rss_mb": 700.0, "torch_in_process": True},
               {"model": "resnet50", "what": "single", "engine": "onnx", "sessions": "default",
                "latency_ms_median": 60.0, "peak_rss_mb": 200.0, "torch_in_process": False},
               {"model": "resnet50", "what": "single", "engine": "onnx", "sessions": "basic",
                "latency_ms_median": 90.0, "peak_rss_mb": 160.0, "torch_in_process": False},
               split("onnx", 2, 0.2, "global", "1gbit", 45.0, 80.0, codec="fp16"),
               split("torch", 2, 0.2, "global", "1gbit", 90.0, 720.0, codec="fp16"),
               split("onnx", 2, 0.2, "global", "none", 50.0, 80.0),
               split("torch", 2, 0.2, "global", "none", 70.0, 720.0),
               split("onnx", 2, 0.2, "global", "100mbit", 40.0, 80.0),
               split("onnx", 2, 1.0, "global", "100mbit", 200.0, 90.0),
               split("onnx", 2, 0.2, "joint", "none", 45.0, 120.0)]
    text = edge.page_section({edge.EDGE: entries, edge.PINGPONG: {"rows": [
        {"transport": "zmq", "bytes": 1024, "one_way_ms": 0.06}]}})
    assert "| N=2 r=0.2 global | ONNX Runtime | 2 | 80 | 10.00 | no | 50.0 | - | 40.0 | - | 10 | 5.0 |  |" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("- ")]
    assert "**met**" in lines[0] and "(80 MB against 10 + 80)" in lines[0]
    assert "**met**" in lines[1] and "0.111x" in lines[1]
    assert "**not met**" in lines[2] and "(120 MB against 160: 0.750x)" in lines[2]  # the leaner dense process
    assert "**met**" in lines[3] and "(45.0 ms against 60.0: 0.75x)" in lines[3]  # the faster dense process
    assert "**met**" in lines[4] and "(45.0 ms against 90.0: 0.50x)" in lines[4]
    assert "**met**" in lines[5] and "5.00x" in lines[5]
    assert "**not measured yet**" in lines[6] and "ONNX engine within 1e-4" in lines[6]  # no architectures data
    assert "**met**" in lines[7] and "0.060 ms" in lines[7]
    assert "80 MB on the ONNX Runtime engine against 720 MB" in edge.headline({edge.EDGE: entries})
    assert "**not measured yet**" in edge.page_section({edge.EDGE: entries[:1]})


def test_long_joint_target_compares_the_separated_branches_at_their_own_length():
    """The joint runs of the separated branches' length (250k) are held against them, not every length's runs
    pooled (the 10k and 100k runs, points lower, made the pooled std look 'not above')."""
    data = _long(joint=85.5)
    data[selection_long.LONG] += [_run("joint", 2, 0.2, "lasso", 10, s, 72.0 + s) for s in range(3)]
    data[selection_long.LONG] += [_run("global", 2, 0.0, "lasso", 250, s, 82.0 + 0.1 * s) for s in range(3)]
    joint = next(ln for ln in selection_long.page_section(data).splitlines() if ln.startswith("- Joint"))
    assert "Separated branches at 250k: 82.10 +- 0.10 (3 seeds); joint mean - std above their mean + std" in joint
    assert "**met**" in joint
    data[selection_long.LONG] = [e for e in data[selection_long.LONG] if e["target_ratio"] != 0.0] + [
        _run("global", 2, 0.0, "lasso", 250, s, 85.6 + 0.1 * s) for s in range(3)]
    joint = next(ln for ln in selection_long.page_section(data).splitlines() if ln.startswith("- Joint"))
    assert "not above their mean + std" in joint and "**not met**" in joint


def test_tune_screen_judges_on_the_validation_split_and_says_how_much_was_screened():
    assert registry.TABLES["selection_tune"][0] == (selection_long.LONG, selection_long.TUNE)  # both files reach it
    data = _long()
    ref = [_run("joint", 2, 0.2, "lasso", 100, s, 84.0) for s in range(3)]
    for k, e in enumerate(ref):
        e.update(val_top1=85.0 + 0.5 * k, lasso_weight="bytes")
    data[selection_long.LONG] = ref
    screen = [dict(ref[0], setting="lr0.05", val_top1=86.0, top1=80.0), dict(ref[0], setting="lasso4", val_top1=84.0)]
    text = selection_long.tune_screen({**data, selection_long.TUNE: screen})
    assert "| lr0.05 | 86.00 | +1.00 | 80.00 |" in text and "So far (2 of 5 settings screened)" in text
    assert "more than the seeds' spread" in text  # +1.00 against a spread of 0.50
    assert "No run of the settings screen" in selection_long.tune_screen(data)
