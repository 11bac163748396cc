"""Re-run the trust review's probes (issue 37) and print one ``PASS`` / ``HOLE`` line per probe.

Each probe reconstructs one finding of the adversarial review: a user's files lost, a compiled loss that slips
through the guard, a diverging run ending in a traceback, an optional cache that fails evaluation, an OOD score
that refuses an input, a recipe error that is a traceback instead of one ``error:`` line with exit status 2. A probe
is a ``HOLE`` when the old behaviour is back. Run it as a script (``python benchmarks/probe_trust.py``: exit status
1 when a hole is found) or through ``tests/test_trust_probes.py``. Everything is offline and small (a 16-32 px
``test_resnet``, a few generated images); the recipe probes run the commands in subprocesses, as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBES: list[tuple[str, Callable[[Path], str | None]]] = []


def probe(name: str) -> Callable:
    """Register ``fn(tmp) -> None`` (PASS) or a string saying what is wrong (HOLE)."""

    def register(fn: Callable[[Path], str | None]) -> Callable[[Path], str | None]:
        PROBES.append((name, fn))
        return fn

    return register


# ---------------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------------
def run_recipe(recipe: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)  # noqa: TID251 - a probe runs the commands as a user would, offline
    path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(PYTHONPATH=path, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", f"pml_suprank.recipes.{recipe}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str | None:
    """``None`` when the command ended with exit status 2 and exactly one ``error:`` line, no traceback, and the
    message (that line and the details below it) names every needle; otherwise what happened."""
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1][:300]
    if "Traceback" in proc.stderr:
        return f"traceback (rc {proc.returncode}): {tail}"
    if proc.returncode != 2:
        return f"exit status {proc.returncode}, not 2: {tail}"
    if len(errors) != 1:
        return f"{len(errors)} error: lines: {tail}"
    message = proc.stderr[proc.stderr.index(errors[0]) :]
    missing = [n for n in needles if n not in message]
    return f"the error line does not name {missing}: {errors[0][:300]}" if missing else None


def write_images(folder: Path, count: int, seed: int, size: int = 20) -> None:
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / f"img{i}.png")


def class_folders(root: Path, classes: int = 6, per_class: int = 4) -> Path:
    for c in range(classes):
        write_images(root / f"class{c}", per_class, seed=c)
    return root


def model_folder(tmp: Path, image_size: int = 32) -> Path:
    from pml_suprank.models import RetrievalModel

    folder = tmp / f"model{image_size}"
    if not folder.exists():
        RetrievalModel("test_resnet", embedding_size=8, image_size=image_size).save_pretrained(folder)
    return folder


# ---------------------------------------------------------------------------------------------------------------------
# 1. a user's files are never lost
# ---------------------------------------------------------------------------------------------------------------------
@probe("overwrite_output_dir keeps a user's own final/ and checkpoints/")
def _overwrite_keeps_user_files(tmp: Path) -> str | None:
    from pml_suprank.training.run_folder import OutputDirError, claim_output_dir

    (tmp / "final").mkdir()
    (tmp / "final" / "mine.txt").write_text("user data")
    (tmp / "checkpoints").mkdir()
    (tmp / "checkpoints" / "notes.txt").write_text("user data")
    try:
        claim_output_dir(tmp, overwrite=True, note=lambda _: None)
    except OutputDirError:
        pass
    lost = [p for p in ("final/mine.txt", "checkpoints/notes.txt") if not (tmp / p).is_file()]
    return f"deleted {lost}" if lost else None


@probe("--output_dir inside the --dataset class folder is refused (exit 2)")
def _output_inside_dataset(tmp: Path) -> str | None:
    data = class_folders(tmp / "images")
    proc = run_recipe("train", "--dataset", str(data), "--output_dir", str(data / "run"), "--backbone", "test_resnet",
                      "--image_size", "16", "--cpu", "--epochs", "1")  # fmt: skip
    return one_error_line(proc, "--output_dir", "--dataset")


@probe("a label name matplotlib cannot typeset never costs the weights")
def _mathtext_plot(tmp: Path) -> str | None:
    import torch

    from pml_suprank.models import RetrievalModel
    from pml_suprank.training.export import write_final_folder

    model = RetrievalModel("test_resnet", embedding_size=8, image_size=16)
    emb = torch.nn.functional.normalize(torch.randn(12, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    labels = torch.stack([torch.arange(12) % 3, torch.arange(12) % 3 // 2], 1)
    last = (emb, labels, torch.arange(12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            names = ["$\\undefinedmacro$", "group"]
            write_final_folder(tmp / "final", model, config={"seed": 0}, history=[], metrics={"ap": 0.5},
                               embeddings=(last, last), label_names=names, replace=True)  # fmt: skip
        except Exception as e:  # the hole: the plot error ends the write
            return f"{type(e).__name__}: {str(e)[:200]}"
    return None if (tmp / "final" / "model.safetensors").is_file() else "no model.safetensors"


@probe("fit_heat into a folder holding results.json needs --overwrite_output_dir")
def _fit_heat_results(tmp: Path) -> str | None:
    out = tmp / "other"
    out.mkdir()
    (out / "results.json").write_text('{"mine": 1}')
    proc = run_recipe("fit_heat", "--output_dir", str(out), "--backbone", "test_resnet", "--image_size", "32",
                      "--train_epochs", "1", "--detectors", "MSP", "--no_plots", "true")  # fmt: skip
    if json.loads((out / "results.json").read_text()) != {"mine": 1}:
        return "results.json overwritten without --overwrite_output_dir"
    return one_error_line(proc, "--overwrite_output_dir")


# ---------------------------------------------------------------------------------------------------------------------
# 2. the compile guard
# ---------------------------------------------------------------------------------------------------------------------
def _proxy_loss():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class ProxyLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proxies = nn.Parameter(torch.randn(4, 8, generator=torch.Generator().manual_seed(1)))

        def forward(self, emb, labels, proxies=None):
            proxies = self.proxies if proxies is None else proxies
            return F.cross_entropy(emb @ F.normalize(proxies, dim=1).T * 8, labels)

    def batch(n: int):
        g = torch.Generator().manual_seed(n)
        return F.normalize(torch.randn(n, 8, generator=g), dim=1).requires_grad_(True), torch.arange(n) % 4

    return ProxyLoss(), batch


def _guard_raises(compiled_of: Callable, calls: list[int], eager_of: Callable | None = None) -> str | None:
    from pml_suprank.losses.compile_guard import CompiledLossMismatchError, GuardedCall

    loss, batch = _proxy_loss()
    module = eager_of(loss) if eager_of is not None else loss
    guard = GuardedCall(compiled_of(loss), module)
    try:
        for n in calls:
            guard(*batch(n))
    except CompiledLossMismatchError:
        return None
    return "no CompiledLossMismatchError"


@probe("compile guard: a graph that diverges after a recompile (B=6) is refused")
def _guard_recompile(tmp: Path) -> str | None:
    return _guard_raises(lambda loss: lambda e, l: loss._call_impl(e, l) * (1 if e.shape[0] == 8 else 2), [8, 8, 6])


@probe("compile guard: a missing gradient of the loss's proxies is refused")
def _guard_proxies(tmp: Path) -> str | None:
    return _guard_raises(lambda loss: lambda e, l: loss._call_impl(e, l, loss.proxies.detach()), [8])


@probe("compile guard: a (value, extras) return is checked")
def _guard_tuple(tmp: Path) -> str | None:
    from torch import nn

    def eager_of(loss):
        class Eager(nn.Module):
            def forward(self, e, l):
                return loss._call_impl(e, l), {"n": e.shape[0]}

        module = Eager()
        module.proxies = loss.proxies
        return module

    return _guard_raises(lambda loss: lambda e, l: (loss._call_impl(e, l) * 3, {"n": e.shape[0]}), [8], eager_of)


@probe("compile guard: NaN in eager and compiled alike is no mismatch")
def _guard_nan(tmp: Path) -> str | None:
    import torch

    from pml_suprank.losses.compile_guard import CompiledLossMismatchError, GuardedCall

    loss, batch = _proxy_loss()
    emb, labels = batch(8)
    guard = GuardedCall(lambda e, l: loss._call_impl(e, l), loss)
    try:
        guard(torch.full_like(emb, float("nan")).requires_grad_(True), labels)
    except CompiledLossMismatchError as e:
        return f"false alarm: {str(e)[:120]}"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# 3. divergence, 4. the numba cache, 6. OOD scores
# ---------------------------------------------------------------------------------------------------------------------
@probe("diverged (inf) weights: skipped steps, then NonFiniteTrainingError (no ValueError traceback)")
def _diverged(tmp: Path) -> str | None:
    import torch
    from accelerate import Accelerator

    from pml_suprank import data, losses
    from pml_suprank.models import RetrievalModel
    from pml_suprank.training import NonFiniteTrainingError, Trainer, TrainingConfig

    model = RetrievalModel("test_resnet", embedding_size=16, image_size=16)
    train = data.SyntheticShapes("train", num_per_class=4, image_size=16,
                                 transform=data.build_transforms(model.data_config, train=True))  # fmt: skip
    config = TrainingConfig(output_dir=str(tmp), epochs=1, batch_size=16, samples_per_class=4, eval_every=0,
                            max_train_steps=4, max_nonfinite_steps=1)  # fmt: skip
    loss = losses.HAPPIERLoss(num_classes=54, embedding_size=16)
    trainer = Trainer(Accelerator(cpu=True), model, loss, train, config)
    with torch.no_grad():
        next(model.parameters()).fill_(float("inf"))
    try:
        trainer.train()
    except NonFiniteTrainingError:
        return None
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    return "the run finished on non-finite weights"


def _numba_probe(tmp: Path, break_cache: Callable) -> str | None:
    import numba

    from pml_suprank.metrics import _numba_jit

    def add_one(x):
        return x + 1

    previous = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(tmp)
    try:
        _numba_jit.njit()(add_one)(1)
        with break_cache(tmp), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return None if _numba_jit.njit()(add_one)(41) == 42 else "wrong result"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        numba.config.CACHE_DIR = previous


@probe("numba cache: a corrupt index falls back to compiling in memory")
def _numba_corrupt(tmp: Path) -> str | None:
    import contextlib

    @contextlib.contextmanager
    def corrupt(folder):
        for path in folder.rglob("*.nbi"):
            path.write_bytes(b"\x80\x04garbage")
        yield

    return _numba_probe(tmp, corrupt)


@probe("numba cache: a full disk falls back to compiling in memory")
def _numba_full(tmp: Path) -> str | None:
    import contextlib

    from numba.core import caching

    @contextlib.contextmanager
    def full(folder):
        for path in folder.rglob("*.nb*"):
            path.unlink()

        def no_space(self, path):
            raise OSError(28, "No space left on device")

        real = caching.IndexDataCacheFile._open_for_write
        caching.IndexDataCacheFile._open_for_write = no_space
        try:
            yield
        finally:
            caching.IndexDataCacheFile._open_for_write = real

    return _numba_probe(tmp, full)


@probe("OOD: Mahalanobis / RMDS fitted at another scale answer every input (saturated, most OOD)")
def _ood_scale(tmp: Path) -> str | None:
    import torch

    from pml_suprank import ood

    z, labels = torch.randn(200, 8, generator=torch.Generator().manual_seed(3)), torch.arange(200) % 4
    for make in (ood.Mahalanobis, ood.RMDS):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                scores = make().fit(features=z * 1e-30, labels=labels).score(features=z[:5])
            except ValueError as e:
                return f"{make.__name__}: {str(e)[:150]}"
        if not bool(torch.isfinite(scores).all()):
            return f"{make.__name__}: non-finite scores"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# 7. recipe errors: one error: line, exit 2
# ---------------------------------------------------------------------------------------------------------------------
@probe("fit_heat --checkpoint of a file that is not a state dict")
def _fit_heat_checkpoint(tmp: Path) -> str | None:
    import torch

    bad = tmp / "model.pt"
    torch.save([1, 2, 3], bad)
    return one_error_line(run_recipe("fit_heat", "--backbone", "test_resnet", "--checkpoint", str(bad),
                                     "--output_dir", str(tmp / "out")), "--checkpoint")  # fmt: skip


@probe("fit_heat --model of a 32-px model (std pooling needs 2 spatial positions), before training")
def _fit_heat_small_model(tmp: Path) -> str | None:
    proc = run_recipe("fit_heat", "--model", str(model_folder(tmp, 32)), "--id_dataset", "synthetic",
                      "--output_dir", str(tmp / "out"), "--detectors", "HEAT", "--no_plots", "true")  # fmt: skip
    if "training the classifier" in proc.stdout or "classifier epoch" in proc.stdout:
        return "the classifier was trained before the refusal"
    return one_error_line(proc, "--model")


@probe("ood_benchmark --features of a garbage file")
def _ood_benchmark_garbage(tmp: Path) -> str | None:
    bad = tmp / "features.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    return one_error_line(run_recipe("ood_benchmark", "--features", str(bad), "--output_dir", str(tmp / "out")),
                          "--features")  # fmt: skip


@probe("ood_benchmark --features of a foreign safetensors file")
def _ood_benchmark_foreign(tmp: Path) -> str | None:
    import torch
    from safetensors.torch import save_file

    bad = tmp / "weights.safetensors"
    save_file({"layer.weight": torch.zeros(3, 3)}, str(bad))
    return one_error_line(run_recipe("ood_benchmark", "--features", str(bad), "--output_dir", str(tmp / "out")),
                          "--features")  # fmt: skip


@probe("prepare_dataset with a missing --root")
def _prepare_missing_root(tmp: Path) -> str | None:
    return one_error_line(run_recipe("prepare_dataset", "cub", "--root", str(tmp / "nope"),
                                     "--output_dir", str(tmp / "out")), "--root")  # fmt: skip


@probe("prepare_dataset with an --output_dir that is a file")
def _prepare_output_file(tmp: Path) -> str | None:
    (tmp / "file").write_text("x")
    (tmp / "cub").mkdir()
    return one_error_line(run_recipe("prepare_dataset", "cub", "--root", str(tmp / "cub"),
                                     "--output_dir", str(tmp / "file")), "--output_dir")  # fmt: skip


@probe("evaluate --model of a missing folder")
def _evaluate_missing_model(tmp: Path) -> str | None:
    return one_error_line(run_recipe("evaluate", "--model", str(tmp / "missing"), "--cpu"), "--model")


@probe("evaluate --model of an uncached Hub id offline")
def _evaluate_offline_hub(tmp: Path) -> str | None:
    return one_error_line(run_recipe("evaluate", "--model", "nobody-here/no-such-model-37", "--cpu"), "--model")


@probe("evaluate --output_dir that is a file")
def _evaluate_output_file(tmp: Path) -> str | None:
    (tmp / "file").write_text("x")
    return one_error_line(run_recipe("evaluate", "--model", str(model_folder(tmp, 16)), "--cpu", "--num_per_class", "2",
                                     "--output_dir", str(tmp / "file")), "--output_dir")  # fmt: skip


@probe("search --output_dir that is a file")
def _search_output_file(tmp: Path) -> str | None:
    (tmp / "file").write_text("x")
    return one_error_line(run_recipe("search", "--model", str(model_folder(tmp, 16)), "--gallery", "synthetic",
                                     "--output_dir", str(tmp / "file")), "--output_dir")  # fmt: skip


@probe("search --gallery with an unusable image")
def _search_bad_image(tmp: Path) -> str | None:
    gallery = class_folders(tmp / "gallery", classes=3, per_class=3)
    (gallery / "class0" / "broken.png").write_bytes(b"not an image")
    args = ["--label_columns", "label", "--gallery_split", "train", "--output_dir", str(tmp / "out")]
    proc = run_recipe("search", "--model", str(model_folder(tmp, 16)), "--gallery", str(gallery), *args)
    return one_error_line(proc, "broken.png")


@probe("an own folder where every class has one image is refused (no NaN metrics in final/)")
def _single_image_classes(tmp: Path) -> str | None:
    data = class_folders(tmp / "images", classes=8, per_class=1)
    proc = run_recipe("train", "--dataset", str(data), "--output_dir", str(tmp / "run"), "--backbone", "test_resnet",
                      "--image_size", "16", "--cpu", "--epochs", "1", "--skip_initial_eval", "true")  # fmt: skip
    if (tmp / "run" / "final").exists():
        return "final/ written"
    return one_error_line(proc, "--dataset")


@probe("the documented layout: metadata.csv at the root + train/ and test/")
def _metadata_root_layout(tmp: Path) -> str | None:
    from pml_suprank.data import image_folder_layout, load_retrieval_dataset

    root = tmp / "shop"
    rows = ["file_name,product,category"]
    for split in ("train", "test"):
        for c in range(4):
            write_images(root / split / f"p{c}", 2, seed=c)
            rows += [f"{split}/p{c}/img{i}.png,p{c},cat{c // 2}" for i in range(2)]
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
    try:
        layout = image_folder_layout(root)
        train = load_retrieval_dataset(str(root), list(layout.label_columns), split="train")
        test = load_retrieval_dataset(str(root), list(layout.label_columns), split="test")
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None if (len(train), len(test)) == (8, 8) else f"{len(train)} / {len(test)} images, not 8 / 8"


def main(selected: list[str] | None = None) -> int:
    holes = 0
    for name, fn in PROBES:
        if selected and not any(s in name for s in selected):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                problem = fn(Path(tmp))
            except Exception as e:  # a probe that crashes is a hole too
                problem = f"probe crashed: {type(e).__name__}: {str(e)[:200]}"
        holes += problem is not None
        print(f"{'PASS' if problem is None else 'HOLE'}  {name}" + ("" if problem is None else f"  -- {problem}"),
              flush=True)  # fmt: skip
    print(f"{holes} hole(s)")
    return holes


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1:]) else 0)
