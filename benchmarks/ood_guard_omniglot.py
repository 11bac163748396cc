"""Real-image benchmark of the OOD guard: does a retrieval model trained on some Omniglot alphabets reject images of
alphabets it never saw (near-OOD) and images of another kind (far-OOD), at the threshold the guard stores?

    python benchmarks/ood_guard_omniglot.py --data_root ../shared/data/omniglot_small
    python benchmarks/ood_guard_omniglot.py --data_root DIR --steps 100 --detectors Mahalanobis   # a quick look

Protocol (fixed before any result was seen):

* data: Omniglot small (character → alphabet), read at run time from ``--data_root``, images at 64×64 grey (ink = 1,
  3 channels, [-1, 1]; :mod:`real_hierarchical_retrieval`'s decoding). The 8 alphabets sorted by name; every fourth
  from the fourth (``Japanese_(katakana)``, ``Tagalog``) is **held out**: near-OOD, all its images of both splits.
* ID: the 6 other alphabets. The model and the detectors see their ``train`` split only; the **held-out ID** images
  are their ``test`` split (new characters of known alphabets: what an open-set gallery holds).
* model: ``test_resnet`` RetrievalModel, 64-d, trained ``--steps`` steps with ROADMAP on the ID training split
  (:func:`real_hierarchical_retrieval.train_loss`, its protocol: Adam 1e-3, hierarchical batches of 64), saved with
  ``save_pretrained`` and loaded back (the guard names the weights' SHA-256).
* guards: :meth:`pml_suprank.ood.guard.OODGuard.fit` with HEAT (priors ``gmm`` + ``gmm_std``: the retrieval model
  has no classifier head for ``el``; preset ``fast``), Mahalanobis and KNN (k = 10) on the pooled backbone features,
  class-conditional on the characters; threshold at ``--tpr`` (0.95) of half the held-out ID images, ID TPR
  measured on the other half.
* far-OOD: ``noise`` = uniform noise images (grey, 64×64), ``shapes`` = SyntheticShapes renders (colour shapes on a
  plain background, 64×64) — another kind of image.

Prints one markdown row per detector: threshold, held-out ID kept (TPR), and per OOD set the share accepted as ID
(FPR) and the AUROC; writes ``results.json`` under ``--output_dir``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - before torch: spinning OpenMP threads stall a shared CPU

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "benchmarks"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

from real_hierarchical_retrieval import LOSSES, Protocol, to_input, train_loss  # noqa: E402

DETECTORS = ("HEAT", "Mahalanobis", "KNN")


def load_omniglot(root: str, image_size: int) -> dict[str, tuple[torch.Tensor, torch.Tensor, list[str]]]:
    """``{split: (ink images (N, 1, S, S), labels (N, 2) raw ids, alphabet name per image)}``."""
    from PIL import Image

    from pml_suprank.data import load_benchmark

    def decode(img) -> torch.Tensor:
        grey = img.convert("L").resize((image_size, image_size), Image.Resampling.BOX)
        return (1.0 - torch.from_numpy(np.asarray(grey, dtype=np.float32)) / 255.0).view(1, image_size, image_size)

    out = {}
    for split in ("train", "test"):
        ds = load_benchmark("omniglot", root, split, transform=decode)
        images = torch.stack([ds[i]["image"] for i in range(len(ds))])
        out[split] = (images, ds.labels.clone(), [name.split("/")[1] for name in ds.names])
    return out


def build_detector(name: str, seed: int):
    from pml_suprank import ood

    if name == "HEAT":
        return ood.HEAT(priors=("gmm", "gmm_std"), preset="fast", seed=seed)
    if name == "KNN":
        return ood.KNN(k=10)
    return ood.get_detector(name)()


def batches(images: torch.Tensor, labels: torch.Tensor | None = None, size: int = 256) -> list[dict]:
    out = []
    for i in range(0, len(images), size):
        item = {"image": images[i : i + size]}
        if labels is not None:
            item["labels"] = labels[i : i + size]
        out.append(item)
    return out


def run(args: argparse.Namespace) -> dict:
    from pml_suprank import data
    from pml_suprank.models import RetrievalModel
    from pml_suprank.ood.guard import OODGuard

    t0 = time.perf_counter()
    size = args.image_size
    splits = load_omniglot(args.data_root, size)
    alphabets = sorted({a for _, _, names in splits.values() for a in names})
    held_out = alphabets[3::4]
    print(f"alphabets {alphabets}; held out (near-OOD): {held_out}", flush=True)

    def part(split: str, known: bool) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels, names = splits[split]
        keep = torch.tensor([(a not in held_out) == known for a in names])
        return images[keep], labels[keep]

    train_images, train_labels = part("train", True)
    train_labels = torch.stack([torch.unique(col, return_inverse=True)[1] for col in train_labels.T], 1)
    heldout_images, _ = part("test", True)
    near = torch.cat([part("train", False)[0], part("test", False)[0]])
    g = torch.Generator().manual_seed(args.seed)
    noise = torch.rand(args.num_far, 1, size, size, generator=g)
    shapes = data.SyntheticShapes(
        "test",
        num_per_class=max(1, args.num_far // 30),
        image_size=size,
        seed=args.seed,
        transform=lambda im: torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0),
    )
    shape_images = torch.stack([shapes[i]["image"].permute(2, 0, 1) for i in range(min(len(shapes), args.num_far))])
    ood_sets = {"near: held-out alphabets": to_input(near), "far: uniform noise": to_input(noise),
                "far: synthetic shapes": shape_images * 2.0 - 1.0}  # fmt: skip
    print(f"ID train {len(train_images)}, held-out ID {len(heldout_images)}, "
          + ", ".join(f"{k} {len(v)}" for k, v in ood_sets.items()), flush=True)  # fmt: skip

    protocol = Protocol(image_size=size)
    factory, hierarchical = LOSSES["roadmap"]
    torch.manual_seed(args.seed)
    model, last = train_loss(factory, hierarchical, args.seed, args.steps, (train_images, train_labels), protocol)
    print(f"ROADMAP: {args.steps} steps, last loss {last:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    with tempfile.TemporaryDirectory(prefix="ood_guard_bench_") as tmp:
        model.save_pretrained(Path(tmp) / "final", model_card=False)
        model = RetrievalModel.from_pretrained(Path(tmp) / "final").eval()
        rows = {}
        for name in args.detectors:
            start = time.perf_counter()
            guard = OODGuard.fit(
                model, batches(to_input(train_images), train_labels[:, 0]), batches(to_input(heldout_images)),
                detector=build_detector(name, args.seed), ood_loaders={k: batches(v) for k, v in ood_sets.items()},
                tpr_target=args.tpr, seed=args.seed,
            )  # fmt: skip
            guard.save(Path(tmp) / "final")  # as fit_heat --model does: the guard travels with the model
            reloaded = RetrievalModel.from_pretrained(Path(tmp) / "final").ood_guard
            assert reloaded.threshold == guard.threshold
            rows[name] = {**guard.to_dict(), "seconds": time.perf_counter() - start}
            print(
                f"{name}: threshold {guard.threshold:.4g}, held-out ID kept {100 * guard.id_tpr:.1f}%, "
                + ", ".join(f"{k} FPR {100 * v['fpr']:.1f}%" for k, v in guard.ood_sets.items()),
                flush=True,
            )
    return {"held_out_alphabets": held_out, "steps": args.steps, "tpr_target": args.tpr, "image_size": size,
            "sizes": {"id_train": len(train_images), "heldout_id": len(heldout_images),
                      **{k: len(v) for k, v in ood_sets.items()}},
            "rows": rows, "torch": torch.__version__, "seconds": time.perf_counter() - t0}  # fmt: skip


def markdown(result: dict) -> str:
    names = list(next(iter(result["rows"].values()))["ood_sets"])
    head = ["guard", "threshold", "held-out ID kept (TPR)", *(f"{n}: FPR / AUROC" for n in names)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for det, row in result["rows"].items():
        cells = [det, f"{row['threshold']:.4g}", f"{100 * row['id_tpr']:.1f} %"]
        cells += [f"{100 * row['ood_sets'][n]['fpr']:.1f} % / {100 * row['ood_sets'][n]['auroc']:.1f}" for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data_root", required=True, help="folder holding the Omniglot small archives")
    p.add_argument("--steps", type=int, default=400, help="ROADMAP training steps")
    p.add_argument("--image_size", type=int, default=64, help="image side (>= 64: gmm_std needs 2x2 feature maps)")
    p.add_argument("--tpr", type=float, default=0.95, help="share of held-out ID images the threshold keeps")
    p.add_argument("--num_far", type=int, default=600, help="images per far-OOD set")
    p.add_argument("--detectors", nargs="+", default=list(DETECTORS), choices=DETECTORS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--output_dir", default="outputs/ood_guard_omniglot")
    args = p.parse_args(argv)
    if not Path(args.data_root).is_dir():
        p.error(f"--data_root {args.data_root}: no such folder")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(markdown(result))
    print(f"total {result['seconds']:.0f} s; results.json in {out}")
    return result


if __name__ == "__main__":
    main()
