"""README.md and docs/: short, generated from results/*.json, and every link leads somewhere."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "recipes"))
import tables  # noqa: E402

PAGES = tables.pages(ROOT)


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text())
    assert n < 15_000, f"README.md has {n} characters; move details to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_tables_are_what_the_results_json_gives(page):
    text = page.read_text()
    assert tables.render(text, ROOT / "results") == text, (
        f"{page.relative_to(ROOT)} differs from results/*.json: run python recipes/tables.py")


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
            assert name in tables.TABLES, f"{page.name}: unknown marker {name}"
            assert body.strip(), f"{page.name}: marker {name} is empty (its results JSON is missing?)"
            seen.add(name)
    assert {"headline", "latency_short", "cifar10_resnet", "latency"} <= seen


def test_render_fills_a_marker_from_json_and_refuses_an_unknown_one(tmp_path):
    (tmp_path / "latency.json").write_text('{"entries": [{"model": "m", "nodes": 2, "bandwidth_mbit": 100, '
                                           '"shaping": "pacing", "codec": "fp32", "mode": "dense", "ratio": 1.0, '
                                           '"input_shape": [1, 3, 8, 8], "latency_ms_median": 50.0}, '
                                           '{"model": "m", "nodes": 2, "bandwidth_mbit": 100, "shaping": "pacing", '
                                           '"codec": "fp32", "mode": "disco", "ratio": 0.1, '
                                           '"input_shape": [1, 3, 8, 8], "latency_ms_median": 20.0}]}')
    out = tables.render("a\n<!-- table:latency_short -->\nold\n<!-- /table:latency_short -->\nb", tmp_path)
    assert "| m | 3x8x8 | 50 | - | 20 | - | 2.5x |" in out and "old" not in out
    assert tables.render("<!-- table:sr_summary -->\nkept\n<!-- /table:sr_summary -->", tmp_path).count("kept") == 1
    with pytest.raises(KeyError, match="unknown table marker"):
        tables.render("<!-- table:nope -->\n<!-- /table:nope -->", tmp_path)


def _script(path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_page_{Path(path).stem}_{Path(path).parent.name}", ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _json(name: str):
    import json

    return json.loads((ROOT / "results" / name).read_text())


def _codecs_page() -> str:
    mod = _script("recipes/codecs/run.py")
    return mod.report({**_json("codecs.json"), "notes": mod.NOTES})


WHOLE_PAGES = {  # page -> how its generator writes it from the committed JSON
    "docs/architectures.md": lambda: _script("recipes/architectures/run.py").table(_json("architectures.json")),
    "docs/codecs.md": _codecs_page,
    "docs/choosing-a-split.md": lambda: _script("recipes/plan/choosing_split.py").page(_json("plan_resnet50.json")),
    "docs/latency-model.md": lambda: _script("bench/latency_fit.py").page(_json("latency_model.json")),
}


@pytest.mark.parametrize("page", sorted(WHOLE_PAGES))
def test_whole_generated_pages_are_what_their_script_writes(page):
    """Pages written whole by a recipe or bench script (then their markers by recipes/tables.py) match what
    the script writes from the committed JSON: no hand edit survives, no stale page."""
    expected = tables.render(WHOLE_PAGES[page](), ROOT / "results")
    assert (ROOT / page).read_text() == expected, f"{page} is not what its generator writes from results/"
