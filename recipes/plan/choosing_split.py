"""The planner's output for resnet50 at 10 Mbit/s, 100 Mbit/s and 1 Gbit/s (docs/choosing-a-split.md's data).

    OMP_NUM_THREADS=1 .venv/bin/python recipes/plan/choosing_split.py            # plan + JSON + plots
    .venv/bin/python -m recipes.pages                                            # then the page from the JSON

Runs ``disco plan resnet50 --input-shape 1,3,224,224 --bandwidth B --latency 2ms --nodes 2,4
--codecs fp32,fp16,int8 --json --plot results/plan_resnet50_B.png`` for each B, keeps the JSON in
results/plan_resnet50.json (recipes/pages/choosing_split.py writes the page from it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "plan_resnet50.json"
LINKS = ["10mbit", "100mbit", "1gbit"]


def cmd(bw: str) -> list[str]:
    return ["disco", "plan", "resnet50", "--input-shape", "1,3,224,224", "--bandwidth", bw, "--latency", "2ms",
            "--nodes", "2,4", "--codecs", "fp32,fp16,int8", "--json", "--plot", f"results/plan_resnet50_{bw}.png"]


def main() -> int:
    data = json.loads(OUT.read_text()) if OUT.is_file() else {}
    for bw in LINKS:
        c = [sys.executable, "-m", "disco.cli", *cmd(bw)[1:]]
        print("+", " ".join(cmd(bw)), flush=True)
        out = subprocess.run(c, check=True, stdout=subprocess.PIPE, text=True, cwd=ROOT).stdout
        data[bw] = json.loads(out.strip().splitlines()[-1])
        OUT.write_text(json.dumps(data, indent=1))
    print("then: python -m recipes.pages (docs/choosing-a-split.md from the JSON)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
