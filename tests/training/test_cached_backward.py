"""Tests of pml_suprank/training/cached_backward.py: gradient-cached virtual batches equal the full-batch backward.

For every rank loss (flat, hierarchical, multi-label, with proxies / calibration) in float64, the loss value and the
``.grad`` of every parameter of the model and of the loss match the plain backward to 1e-9 relative, with dropout,
with an uneven last chunk, with a memory, ``indices_tuple`` and dict / tuple inputs; a 2-process gloo run
(tests/training/_cached_backward_worker.py) checks ``DistributedRankLoss`` + DDP against one process.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _helpers import MULTILABEL_TABLE, free_port, random_label_sets
from torch import nn

from pml_suprank import losses
from pml_suprank.memory import RankingMemory
from pml_suprank.training import cached_backward

D_IN, D, N = 6, 8, 23
WORKER = Path(__file__).parent / "_cached_backward_worker.py"


class Net(nn.Module):
    """A small embedding network: Linear → ReLU → Dropout → Linear → L2 normalisation."""

    def __init__(self, p: float = 0.0, batchnorm: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D_IN, 16)
        self.bn = nn.BatchNorm1d(16) if batchnorm else nn.Identity()
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(16, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.fc2(self.drop(torch.relu(self.bn(self.fc1(x))))), dim=1)


def flat_labels(n: int = N) -> torch.Tensor:
    return torch.arange(n) % 5


def level_labels(n: int = N) -> torch.Tensor:
    fine = (torch.arange(n) * 7) % 6
    return torch.stack([fine, MULTILABEL_TABLE[fine, 1]], 1)


def set_labels(n: int = N) -> torch.Tensor:
    return random_label_sets(n, 3, torch.Generator().manual_seed(3))


T = MULTILABEL_TABLE
CASES = {  # name: (loss factory, labels)
    "SmoothAP": (lambda: losses.SmoothAPLoss(temperature=0.1), flat_labels),
    "SupAP": (lambda: losses.SupAPLoss(), flat_labels),
    "SupAP_sorted": (lambda: losses.SupAPLoss(kernel="sorted"), flat_labels),
    "ROADMAP_calibration": (lambda: losses.ROADMAPLoss(), flat_labels),
    "ROADMAP_proxy": (
        lambda: losses.ROADMAPLoss(decomposability="proxy", num_classes=5, embedding_size=D),
        flat_labels,
    ),
    "SupRecall": (lambda: losses.SupRecallLoss(k=(1, 2, 4)), flat_labels),
    "RODRecall": (lambda: losses.RODRecallLoss(k=(1, 2, 4)), flat_labels),
    "SupHAP": (lambda: losses.SupHAPLoss(), level_labels),
    "HAPPIER": (lambda: losses.HAPPIERLoss(num_classes=6, embedding_size=D), level_labels),
    "HAPPIER_F": (lambda: losses.HAPPIERLoss(num_classes=6, embedding_size=D, alpha=5.0), level_labels),
    "SupNDCG": (lambda: losses.SupNDCGLoss(), level_labels),
    "RODNDCG": (lambda: losses.RODNDCGLoss(6, D), level_labels),
    "SupAP_per_label": (lambda: losses.SupAPLoss(multilabel="per_label"), set_labels),
    "ROADMAP_per_label": (
        lambda: losses.ROADMAPLoss(decomposability="proxy", num_classes=6, embedding_size=D, multilabel="per_label"),
        set_labels,
    ),
    "SupHAP_multilabel": (lambda: losses.SupHAPLoss(hierarchy=T, relevance="multilabel"), set_labels),
    "HAPPIER_multilabel": (
        lambda: losses.HAPPIERLoss(num_classes=6, embedding_size=D, hierarchy=T, relevance="multilabel"),
        set_labels,
    ),
    "SupNDCG_multilabel": (lambda: losses.SupNDCGLoss(hierarchy=T, relevance="multilabel"), set_labels),
    "RODNDCG_multilabel": (lambda: losses.RODNDCGLoss(6, D, hierarchy=T, relevance="multilabel"), set_labels),
}


def inputs(n: int = N, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, D_IN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def pair(p: float = 0.0, make_loss=None):
    """Two identical (model, loss) pairs in float64: one for cached_backward, one for the reference backward."""
    torch.manual_seed(0)
    model = Net(p).double()
    loss_fn = make_loss().double() if make_loss is not None else None
    return (model, loss_fn), copy.deepcopy((model, loss_fn))


def assert_rel(actual: torch.Tensor, expected: torch.Tensor, what: str, tol: float = 1e-9) -> None:
    scale = max(float(expected.abs().max()), 1e-12)
    err = float((actual - expected).abs().max()) / scale
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol}"


def assert_same_grads(mods, refs) -> int:
    """Every parameter of ``mods`` has the ``.grad`` of the same parameter of ``refs``; returns how many."""
    count = 0
    for mod, ref in zip(mods, refs, strict=True):
        for (name, p), q in zip(mod.named_parameters(), ref.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            if q.grad is not None:
                assert_rel(p.grad, q.grad, f"{type(mod).__name__}.{name}.grad")
                count += 1
    return count


def chunked_embeddings(model: nn.Module, x: torch.Tensor, chunk: int) -> torch.Tensor:
    """The embeddings of a chunk-by-chunk forward *with* a graph (what cached_backward differentiates)."""
    return torch.cat([model(x[i : i + chunk]) for i in range(0, x.shape[0], chunk)])


@pytest.mark.parametrize("name", list(CASES))
def test_every_rank_loss_equals_the_full_batch_backward(name):
    make_loss, make_labels = CASES[name]
    (model, loss_fn), (ref_model, ref_loss) = pair(0.0, make_loss)
    x, labels = inputs(), make_labels()
    loss = cached_backward(model, loss_fn, x, labels, chunk_size=5)  # chunks 5, 5, 5, 5, 3
    expected = ref_loss(ref_model(x), labels)
    expected.backward()
    assert not loss.requires_grad and loss.dim() == 0
    assert_rel(loss, expected.detach(), "loss")
    counted = assert_same_grads([model, loss_fn], [ref_model, ref_loss])
    assert counted == 4 + len([p for p in ref_loss.parameters() if p.grad is not None])
    assert float(model.fc1.weight.grad.abs().max()) > 0  # a real gradient, not two zeros


@pytest.mark.parametrize("name", ["SupAP", "ROADMAP_proxy", "HAPPIER_F", "RODNDCG_multilabel"])
@pytest.mark.parametrize("chunk_size", [1, 4, 7, 23, 100])
def test_dropout_and_uneven_chunks(name, chunk_size):
    """With dropout the gradient is that of the chunk-by-chunk forward drawing the same masks (RNG restored)."""
    make_loss, make_labels = CASES[name]
    (model, loss_fn), (ref_model, ref_loss) = pair(0.5, make_loss)
    x, labels = inputs(), make_labels()
    torch.manual_seed(11)
    loss = cached_backward(model, loss_fn, x, labels, chunk_size=chunk_size)
    after = torch.get_rng_state()
    torch.manual_seed(11)
    expected = ref_loss(chunked_embeddings(ref_model, x, chunk_size), labels)
    assert torch.equal(after, torch.get_rng_state())  # the global generator ends as after one chunked forward
    expected.backward()
    assert_rel(loss, expected.detach(), "loss")
    assert_same_grads([model, loss_fn], [ref_model, ref_loss])
    # the masks matter: another draw gives another gradient (so the equality above is not vacuous)
    other_model = copy.deepcopy(ref_model)
    other_model.zero_grad(set_to_none=True)
    torch.manual_seed(12)
    copy.deepcopy(ref_loss)(chunked_embeddings(other_model, x, chunk_size), labels).backward()
    assert float((other_model.fc1.weight.grad - model.fc1.weight.grad).abs().max()) > 1e-6


def test_gradients_accumulate_into_existing_grad_like_backward():
    make_loss, make_labels = CASES["HAPPIER"]
    (model, loss_fn), (ref_model, ref_loss) = pair(0.0, make_loss)
    x, labels = inputs(), make_labels()
    for m in (model, loss_fn, ref_model, ref_loss):
        for p in m.parameters():
            p.grad = torch.full_like(p, 0.25)
    cached_backward(model, loss_fn, x, labels, chunk_size=6)
    ref_loss(ref_model(x), labels).backward()
    assert_same_grads([model, loss_fn], [ref_model, ref_loss])


def test_memory_receives_the_virtual_batch_and_indices():
    """A RankingMemory as loss_fn: enqueues the whole virtual batch once; loss, gradients and memory match."""
    (model, _), (ref_model, _) = pair(0.2)
    mem = RankingMemory(losses.SupAPLoss(), D, 40, mode="index", dtype=torch.float64)
    ref_mem = copy.deepcopy(mem)
    labels = flat_labels()
    for step in range(3):
        x, idx = inputs(seed=step), (torch.arange(N) * 3 + step) % 40
        torch.manual_seed(step)
        loss = cached_backward(model, mem, x, labels, chunk_size=4, indices=idx)
        torch.manual_seed(step)
        expected = ref_mem(chunked_embeddings(ref_model, x, 4), labels, idx)
        expected.backward()
        assert_rel(loss, expected.detach(), f"loss at step {step}")
        assert_same_grads([model], [ref_model])
        assert torch.equal(mem.filled, ref_mem.filled) and int(mem.step) == int(ref_mem.step) == step + 1
        assert_rel(mem.embeddings, ref_mem.embeddings, "memory embeddings")
        with torch.no_grad():
            for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
                p -= 0.3 * p.grad
                q -= 0.3 * q.grad
        model.zero_grad(set_to_none=True)
        ref_model.zero_grad(set_to_none=True)


def test_indices_tuple_is_passed_to_the_loss():
    (model, loss_fn), (ref_model, ref_loss) = pair(0.0, lambda: losses.SupAPLoss())
    x, labels = inputs(), flat_labels()
    a, p = torch.where(labels[:, None] == labels[None, :])
    keep = a != p
    a, p = a[keep][::2], p[keep][::2]
    n_a, n = torch.where(labels[:, None] != labels[None, :])
    tuple4 = (a, p, n_a, n)
    loss = cached_backward(model, loss_fn, x, labels, chunk_size=8, indices_tuple=tuple4)
    expected = ref_loss(ref_model(x), labels, indices_tuple=tuple4)
    expected.backward()
    assert_rel(loss, expected.detach(), "loss")
    assert_same_grads([model], [ref_model])
    assert abs(float(loss) - float(ref_loss(ref_model(x), labels).detach())) > 1e-6  # the pairs changed the loss


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(D_IN, D), nn.Linear(3, D)

    def forward(self, image: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.a(image) + self.b(extra), dim=1)


@pytest.mark.parametrize("form", ["dict", "tuple"])
def test_dict_and_tuple_inputs_are_split_on_dim0(form):
    torch.manual_seed(0)
    model = TwoInputs().double()
    ref_model, loss_fn = copy.deepcopy(model), losses.SupAPLoss()
    x, extra, labels = inputs(), inputs(seed=1)[:, :3], flat_labels()
    batch = {"image": x, "extra": extra} if form == "dict" else (x, extra)
    loss = cached_backward(model, loss_fn, batch, labels, chunk_size=6)
    expected = loss_fn(ref_model(x, extra), labels)
    expected.backward()
    assert_rel(loss, expected.detach(), "loss")
    assert_same_grads([model], [ref_model])


def test_clipping_and_custom_backward_after():
    """backward= receives the loss (here a 2x scaling, as a GradScaler does); clipping after equals clipping the
    full-batch gradient."""
    (model, loss_fn), (ref_model, ref_loss) = pair(0.0, CASES["ROADMAP_proxy"][0])
    x, labels = inputs(), flat_labels()
    cached_backward(model, loss_fn, x, labels, chunk_size=5, backward=lambda loss: (2.0 * loss).backward())
    (2.0 * ref_loss(ref_model(x), labels)).backward()
    norms = [nn.utils.clip_grad_norm_([*m.parameters(), *lf.parameters()], 0.01)
             for m, lf in ((model, loss_fn), (ref_model, ref_loss))]  # fmt: skip
    assert_rel(norms[0], norms[1], "total norm")
    assert_same_grads([model, loss_fn], [ref_model, ref_loss])


def test_batchnorm_in_training_mode_is_refused_unless_allowed():
    torch.manual_seed(0)
    model = Net(batchnorm=True).double()
    x, labels, loss_fn = inputs(), flat_labels(), losses.SupAPLoss()
    with pytest.raises(ValueError, match=r"BatchNorm layers in training mode \(bn\).*allow_batchnorm=True"):
        cached_backward(model, loss_fn, x, labels, chunk_size=8)
    assert model.fc1.weight.grad is None and int(model.bn.num_batches_tracked) == 0  # refused before any forward
    # eval-mode BatchNorm (frozen statistics) is exact
    model.bn.eval()
    ref = copy.deepcopy(model)
    cached_backward(model, loss_fn, x, labels, chunk_size=8)
    loss_fn(ref(x), labels).backward()
    assert_same_grads([model], [ref])
    # opted in: chunk statistics (approximate), running statistics updated once per chunk, not twice
    model.bn.train()
    model.zero_grad(set_to_none=True)
    chunked = copy.deepcopy(model)
    cached_backward(model, loss_fn, x, labels, chunk_size=8, allow_batchnorm=True)
    loss_fn(chunked_embeddings(chunked, x, 8), labels).backward()
    assert_same_grads([model], [chunked])
    assert int(model.bn.num_batches_tracked) == int(chunked.bn.num_batches_tracked) == 3
    assert_rel(model.bn.running_mean, chunked.bn.running_mean, "running_mean")


def test_argument_validation():
    model, loss_fn, x, labels = Net().double(), losses.SupAPLoss(), inputs(), flat_labels()
    with pytest.raises(TypeError, match="chunk_size must be an int >= 1; got float 4.0"):
        cached_backward(model, loss_fn, x, labels, chunk_size=4.0)
    with pytest.raises(TypeError, match="chunk_size must be an int >= 1; got bool"):
        cached_backward(model, loss_fn, x, labels, chunk_size=True)
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1; got 0"):
        cached_backward(model, loss_fn, x, labels, chunk_size=0)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module; got function"):
        cached_backward(lambda t: t, loss_fn, x, labels, chunk_size=4)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        cached_backward(model, 3, x, labels, chunk_size=4)
    with pytest.raises(ValueError, match=r"labels must have one row per input \(N=23 rows\); got shape \(22,\)"):
        cached_backward(model, loss_fn, x, labels[:22], chunk_size=4)
    with pytest.raises(TypeError, match="labels must be a Tensor"):
        cached_backward(model, loss_fn, x, labels.tolist(), chunk_size=4)
    with pytest.raises(ValueError, match="same size along dim 0"):
        cached_backward(TwoInputs().double(), loss_fn, (x, x[:5, :3]), labels, chunk_size=4)
    with pytest.raises(TypeError, match=r"inputs\['extra'\] must be a Tensor"):
        cached_backward(TwoInputs().double(), loss_fn, {"image": x, "extra": 1}, labels, chunk_size=4)
    with pytest.raises(TypeError, match="inputs must be a Tensor or a dict"):
        cached_backward(model, loss_fn, x.numpy(), labels, chunk_size=4)
    with pytest.raises(ValueError, match="at least one item"):
        cached_backward(model, loss_fn, x[:0], labels[:0], chunk_size=4)
    with pytest.raises(ValueError, match="one embedding per input row"):
        cached_backward(nn.Flatten(0), loss_fn, x, labels, chunk_size=4)
    with pytest.raises(ValueError, match="loss_fn must return a scalar Tensor"):
        cached_backward(model, lambda e, y: e.sum(1), x, labels, chunk_size=4)
    with pytest.raises(ValueError, match="does not require grad"):
        cached_backward(model, lambda e, y: e.detach().sum(), x, labels, chunk_size=4)
    with pytest.raises(TypeError, match="allow_batchnorm must be a bool"):
        cached_backward(model, loss_fn, x, labels, chunk_size=4, allow_batchnorm=1)
    with pytest.raises(TypeError, match="backward must be callable"):
        cached_backward(model, loss_fn, x, labels, chunk_size=4, backward="accelerator")


def test_autocast_runs_both_passes_under_the_same_precision():
    """Under CPU autocast (bfloat16) the recomputed chunks match the cached ones: the gradient is that of the
    chunked autocast forward."""
    torch.manual_seed(0)
    model, loss_fn = Net(0.3), losses.SupAPLoss()
    ref = copy.deepcopy(model)
    x, labels = inputs().float(), flat_labels()

    def float32_loss(e, y):  # as LossModule does: the rank loss runs outside autocast, in float32
        with torch.autocast("cpu", enabled=False):
            return loss_fn(e.float(), y)

    torch.manual_seed(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = cached_backward(model, float32_loss, x, labels, chunk_size=8)
    torch.manual_seed(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        emb = chunked_embeddings(ref, x, 8)
    expected = loss_fn(emb.float(), labels)
    expected.backward()
    assert_rel(loss, expected.detach(), "loss", tol=1e-6)
    # the reference sums the chunks' weight gradients in bfloat16 (autocast casts each weight once per graph) where
    # cached_backward sums them in float32: equal to a few bfloat16 ulps (eps 7.8e-3)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert_rel(p.grad, q.grad, "grad", tol=5e-2)  # both are ~10 % from the float32 gradient


@pytest.mark.slow
def test_two_process_gloo_run_equals_one_process(tmp_path):
    """DDP model + DistributedRankLoss (and a RankingMemory) with cached_backward on 2 gloo processes equal the
    single-process full-batch backward of the concatenated global batch."""
    out, port = tmp_path / "result.json", free_port()
    cmd = [sys.executable, str(WORKER), "--out", str(out), "--world-size", "2", "--port", str(port)]
    procs = [
        subprocess.Popen([*cmd, "--rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(2)
    ]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    results = json.loads(out.read_text())
    assert len(results) >= 8
    for key, res in results.items():
        assert "error" not in res, f"{key}: {res}"
        for what, err in res.items():
            assert err <= 1e-9, f"{key} {what}: {err:.3e}"


# ------------------------------------------------------------------------------------------------------------------
# Trainer with TrainingConfig(virtual_batch_size=..., chunk_size=...)
# ------------------------------------------------------------------------------------------------------------------
def _trainer(tmp_path, **kwargs):
    pytest.importorskip("timm")
    from accelerate import Accelerator

    from pml_suprank import data
    from pml_suprank.models import RetrievalModel
    from pml_suprank.training import Trainer, TrainingConfig

    torch.manual_seed(0)
    model = RetrievalModel("test_resnet", embedding_size=16, image_size=16)
    tf = data.build_transforms(model.data_config, train=True, scale=(0.5, 1.0))
    train = data.SyntheticShapes("train", num_per_class=8, image_size=16, transform=tf)
    config = TrainingConfig(
        output_dir=str(tmp_path), epochs=1, batch_size=32, samples_per_class=4, eval_every=0, lr_backbone=1e-3,
        lr_head=1e-3, log_every=1, max_train_steps=2, seed=3, freeze_batch_norm=True, **kwargs,
    )  # fmt: skip
    loss = losses.HAPPIERLoss(num_classes=54, embedding_size=16)
    return Trainer(Accelerator(cpu=True), model, loss, train, config)


def test_trainer_validates_virtual_batch_and_chunk_size(tmp_path):
    with pytest.raises(ValueError, match="--virtual_batch_size 64 and --batch_size 32 differ"):
        _trainer(tmp_path, virtual_batch_size=64, chunk_size=8)
    with pytest.raises(ValueError, match="chunk_size must be null or an int >= 1; got 0"):
        _trainer(tmp_path, chunk_size=0)
    with pytest.raises(TypeError, match="virtual_batch_size must be null or an int >= 2"):
        _trainer(tmp_path, virtual_batch_size=32.0)
    assert _trainer(tmp_path, virtual_batch_size=32, chunk_size=8).chunk_size == 8


@pytest.mark.slow
def test_trainer_with_chunk_size_trains_like_the_plain_batch(tmp_path):
    """HAPPIER on timm's test_resnet (frozen BatchNorm): the Trainer's step with ``chunk_size=8`` (4 chunks of the
    32-image batch) gives the gradients of the plain step (float32 rounding), and two training steps log the same
    losses. (Weights after Adam are not compared: Adam turns 1e-7 differences of near-zero gradients into lr-size
    steps.)"""
    from pml_suprank.training.loss_module import backward_step

    torch.set_num_threads(1)
    plain, cached = _trainer(tmp_path / "plain"), _trainer(tmp_path / "cached", virtual_batch_size=32, chunk_size=8)
    batch = next(iter(plain._train_loader()))
    grads = []
    for trainer in (plain, cached):
        trainer._train_mode()
        args = (batch["image"], batch["labels"], batch["index"])
        loss = backward_step(trainer.accelerator, trainer.loss_module, *args, trainer.chunk_size)
        grads.append((float(loss.detach()), [p.grad for p in trainer.loss_module.parameters()]))
        trainer.optimizer.zero_grad(set_to_none=True)
    assert abs(grads[0][0] - grads[1][0]) <= 1e-5 * abs(grads[0][0])
    checked = 0
    for g_plain, g_cached in zip(grads[0][1], grads[1][1], strict=True):
        assert (g_plain is None) == (g_cached is None)
        if g_plain is not None and float(g_plain.abs().max()) > 0:
            assert_rel(g_cached, g_plain, "grad", tol=2e-5)
            checked += 1
    assert checked >= 20  # backbone, head and proxies
    losses_logged = []
    for name, kwargs in (("plain2", {}), ("cached2", {"chunk_size": 8})):
        history = _trainer(tmp_path / name, **kwargs).train()
        losses_logged.append(torch.tensor([h["loss"] for h in history if "loss" in h]))
    assert losses_logged[0].numel() == 2
    torch.testing.assert_close(losses_logged[1], losses_logged[0], rtol=1e-5, atol=1e-6)


def test_benchmark_script_steps_agree(monkeypatch):
    """benchmarks/bench_cached_backward.py on a tiny setting: its plain and cached steps give the same gradient."""
    import argparse

    pytest.importorskip("timm")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_cached_backward as bench

    args = argparse.Namespace(n=24, chunk=5, image_size=16)
    assert bench.gradient_difference(args) < 1e-4
    model, loss_fn, images, labels, optimizer = bench.build(24, 16)
    before = [p.detach().clone() for p in model.parameters()]
    value = bench.step(model, loss_fn, images, labels, optimizer, chunk=5)
    assert value == value and any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
