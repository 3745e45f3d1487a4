"""Distillation of a cut pretrained network from its dense self, on unlabelled photos, watched by a guard.

- **Photos**: each batch is ``inette_share`` Imagenette train photos (default half) and the rest from the other
  sources of the pool (COCO128, CamVid, BSD100, T91, Set14), so that the ten Imagenette classes do not
  dominate what the teacher says.
- **Augmentation that spreads the teacher's outputs**: random resized crops over a wide range of scales
  (0.08-1), flips, and with probability ``mix`` a CutMix or mixup of the batch with itself reversed (so that
  photos of different sources are mixed). The teacher sees the same augmented batch.
- **Loss**: KL(teacher || student) on the 1000-way outputs at temperature ``T`` plus ``beta`` times the mean
  squared error of the pooled features (the classifier's input), normalised by the teacher's: features carry
  what the network knows of every class, not only the classes of the photos at hand.
- **AdamW** at 1e-4 with a cosine decay: SGD diverges here even at 5e-4 (gradient norms near 200 at the
  start, amplified by frozen batch norms of channels with tiny variance).
- **Batch norm frozen** (running statistics from the calibration, affine parameters trained): small batches of
  crops at another resolution would otherwise rewrite the statistics.
- **The guard** (no photo of either evaluation set): every ``guard_every`` images, top-1 agreement with the
  teacher on a held-out part of the pool, and the share of the held-out *non-Imagenette* photos the student
  calls an Imagenette class. The best state by agreement is kept; a share above the teacher's by more than
  ``max_share_rise`` points stops the run (collapse) and the best state is restored (a collapsed state is never
  the best one, even where its agreement rose; the starting state is kept if no other qualifies).
- Resumable: the state (weights, optimiser, step, curve) is saved at every guard check.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from disco.data.imagenet import Photos, normalize
from disco.tasks.imagenet import share_in

log = logging.getLogger("recipes.pretrained")


@dataclass
class FinetuneConfig:
    images: int = 15000  # images seen
    batch_size: int = 32
    size: int = 160
    lr: float = 1e-4  # AdamW: SGD at 5e-4 already diverges (gradient norms near 200 at the start, through the
    weight_decay: float = 0.0  # frozen batch norms of channels with tiny variance); measured in the closing note
    temperature: float = 2.0
    beta: float = 1.0  # weight of the feature loss
    mix: float = 0.5  # probability of CutMix or mixup per batch
    guard_every: int = 1500
    max_share_rise: float = 10.0
    inette_share: float = 0.5  # share of each batch drawn from Imagenette train photos (the rest: other sources)


def _augment(imgs: Tensor, size: int, gen: torch.Generator) -> Tensor:
    """Random resized crops (scale 0.08-1, aspect 3/4-4/3) and flips of uint8 images -> float [B, 3, size, size]."""
    out = []
    h, w = imgs.shape[-2:]
    for im in imgs:
        for _ in range(10):
            area = h * w * float(torch.empty(1).uniform_(0.08, 1.0, generator=gen))
            ar = math.exp(float(torch.empty(1).uniform_(math.log(3 / 4), math.log(4 / 3), generator=gen)))
            cw, ch = round(math.sqrt(area * ar)), round(math.sqrt(area / ar))
            if 0 < cw <= w and 0 < ch <= h:
                break
        else:
            cw, ch = w, h
        y = int(torch.randint(0, h - ch + 1, (1,), generator=gen))
        x = int(torch.randint(0, w - cw + 1, (1,), generator=gen))
        crop = im[None, :, y:y + ch, x:x + cw].float()
        crop = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        if bool(torch.rand(1, generator=gen) < 0.5):
            crop = crop.flip(-1)
        out.append(crop)
    return torch.cat(out)


def _mix(x: Tensor, gen: torch.Generator) -> Tensor:
    """CutMix or mixup (even odds) of the batch with itself reversed."""
    lam = float(torch.rand(1, generator=gen))  # Beta(1, 1)
    other = x.flip(0)
    if bool(torch.rand(1, generator=gen) < 0.5):
        return lam * x + (1 - lam) * other
    s = x.shape[-1]
    cut = int(s * math.sqrt(1 - lam))
    cy, cx = (int(v) for v in torch.randint(0, s, (2,), generator=gen))
    y0, y1, x0, x1 = max(cy - cut // 2, 0), min(cy + cut // 2, s), max(cx - cut // 2, 0), min(cx + cut // 2, s)
    x = x.clone()
    x[..., y0:y1, x0:x1] = other[..., y0:y1, x0:x1]
    return x


def _features(model: nn.Module, head: str, x: Tensor) -> tuple[Tensor, Tensor]:
    """(logits, the head's input) in one forward."""
    got: list[Tensor] = []
    h = model.get_submodule(head).register_forward_pre_hook(lambda _m, a: got.append(a[0]))
    try:
        out = model(x)
    finally:
        h.remove()
    return out, got[0]


@torch.no_grad()
def _guard_preds(model: nn.Module, guard: Photos, pre: dict[str, Any], size: int) -> tuple[Tensor, float]:
    """Top-1 on the guard photos, and the share of its non-Imagenette photos called an Imagenette class."""
    model.eval()
    preds = []
    for i in range(0, len(guard), 50):
        x = normalize(guard.images[i:i + 50], pre["mean"], pre["std"])
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        preds.append(model(x).argmax(1))
    p = torch.cat(preds)
    other = torch.tensor([s != "inette_train" for s in guard.source])
    return p, share_in(p[other][:, None])


def guard_check(student: nn.Module, teacher_pred: Tensor, guard: Photos, pre: dict[str, Any], size: int
                ) -> dict[str, float]:
    """Top-1 agreement with the teacher on the guard photos and the share of its non-Imagenette photos
    predicted as an Imagenette class."""
    p, share = _guard_preds(student, guard, pre, size)
    return {"agree_guard": 100.0 * float((p == teacher_pred).float().mean()), "share_guard_other": share}


def better(g: dict[str, float], best_agree: float, t_share: float, max_share_rise: float) -> bool:
    """Whether the guard's figures ``g`` make a state the new best: more agreement with the teacher, and not
    collapsed (a share in the fine-tuning classes no more than ``max_share_rise`` points above the teacher's)."""
    return g["agree_guard"] > best_agree and g["share_guard_other"] <= t_share + max_share_rise


def distill(student: nn.Module, teacher: nn.Module, head: str, pool: Photos, guard: Photos, pre: dict[str, Any],
            cfg: FinetuneConfig, seed: int, state_path: Path) -> dict[str, Any]:
    """Fine-tune ``student`` (in place; a DiscoModel's masks stay applied) by distillation; returns the curve and
    why it stopped. The best state by guard agreement is left in ``student``."""
    gen = torch.Generator().manual_seed(seed)
    teacher.eval()
    for m in (student, teacher):  # channels-last: about 1.4x faster forward and backward on the CPU here
        m.to(memory_format=torch.channels_last)
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps = max(1, cfg.images // cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    t_pred, t_share = _guard_preds(teacher, guard, pre, cfg.size)
    src = np.array(pool.source)
    inette, other = np.flatnonzero(src == "inette_train"), np.flatnonzero(src != "inette_train")
    st: dict[str, Any] = {"step": 0, "curve": [], "best": None, "best_agree": -1.0, "stopped": None}
    if state_path.is_file():
        saved = torch.load(state_path, map_location="cpu", weights_only=True)
        student.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        gen.set_state(saved["gen"])
        st = saved["st"]
        log.info("resuming distillation at step %d/%d", st["step"], steps)
    if not st["curve"]:
        g = guard_check(student, t_pred, guard, pre, cfg.size)
        st["curve"].append({"images": 0, **g, "teacher_share_guard_other": t_share})
        st["best_agree"], st["best"] = g["agree_guard"], {k: v.clone() for k, v in student.state_dict().items()}
    every = max(1, cfg.guard_every // cfg.batch_size)
    t0 = time.perf_counter()
    while st["step"] < steps and st["stopped"] is None:
        student.train()
        for m in student.modules():  # frozen statistics (see the module doc)
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()
        half = round(cfg.batch_size * cfg.inette_share)
        idx = np.concatenate([inette[torch.randint(0, len(inette), (half,), generator=gen).numpy()],
                              other[torch.randint(0, len(other), (cfg.batch_size - half,), generator=gen).numpy()]])
        x = _augment(pool.images[idx], cfg.size, gen)
        if bool(torch.rand(1, generator=gen) < cfg.mix):
            x = _mix(x, gen)
        x = normalize(x, pre["mean"], pre["std"]).contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            t_out, t_feat = _features(teacher, head, x)
        s_out, s_feat = _features(student, head, x)
        tt = cfg.temperature
        kl = F.kl_div(F.log_softmax(s_out / tt, 1), F.log_softmax(t_out / tt, 1), reduction="batchmean",
                      log_target=True) * tt * tt
        feat = F.mse_loss(s_feat, t_feat) / t_feat.pow(2).mean().clamp_min(1e-12)
        loss = kl + cfg.beta * feat
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        st["step"] += 1
        if st["step"] % every == 0 or st["step"] == steps:
            g = guard_check(student, t_pred, guard, pre, cfg.size)
            images = st["step"] * cfg.batch_size
            st["curve"].append({"images": images, **g, "loss": float(loss.detach()), "kl": float(kl.detach()),
                                "feat": float(feat.detach()), "seconds": round(time.perf_counter() - t0, 1)})
            log.info("distill %d/%d images: %s", images, steps * cfg.batch_size, st["curve"][-1])
            collapsed = g["share_guard_other"] > t_share + cfg.max_share_rise
            if better(g, st["best_agree"], t_share, cfg.max_share_rise):
                st["best_agree"], st["best"] = g["agree_guard"], {k: v.clone() for k, v in student.state_dict().items()}
                st["best_images"] = images
            if collapsed:
                st["stopped"] = (f"collapse: {g['share_guard_other']:.1f}% of the guard's non-Imagenette photos "
                                 f"called an Imagenette class (teacher {t_share:.1f}%)")
                log.warning("distillation stopped at %d images: %s", images, st["stopped"])
            tmp = state_path.with_name(state_path.name + ".tmp")
            torch.save({"model": student.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "gen": gen.get_state(), "st": st}, tmp)
            tmp.replace(state_path)
    student.load_state_dict(st["best"])
    return {"curve": st["curve"], "stopped": st["stopped"], "best_images": st.get("best_images", 0),
            "train_images_seen": st["step"] * cfg.batch_size}
