"""What exchange placement saves: dense bytes per image at N=2 with channels sent where the mixing op reads
them (``relay=False``) and with channel-local ops after views or upsamplings applied by the receiver (the
default). Writes ``results/placement.json``.

    nice -n 10 .venv/bin/python recipes/architectures/placement.py
"""

from __future__ import annotations

import json
from pathlib import Path

from disco.cost import estimate
from disco.graph import partition
from disco.models import build_model

MODELS = [("densenet121", (1, 3, 224, 224)), ("rrdbnet", (1, 3, 64, 64)),
          ("deeplabv3plus_resnet50", (1, 3, 256, 256)), ("ssd300_vgg16_split", (1, 3, 300, 300))]


def main() -> None:
    out = []
    for name, shape in MODELS:
        model = build_model(name)
        b = {k: estimate(partition(model, shape, 2, relay=relay)).dense_bytes
             for k, relay in (("sender", False), ("receiver", True))}
        out.append({"model": name, "input_shape": list(shape), "nodes": 2, "dense_bytes_sender": b["sender"],
                    "dense_bytes_receiver": b["receiver"], "saving": round(1 - b["receiver"] / b["sender"], 4)})
        print(json.dumps(out[-1]), flush=True)
    path = Path(__file__).resolve().parents[2] / "results" / "placement.json"
    path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
