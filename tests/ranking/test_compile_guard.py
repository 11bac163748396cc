"""Every new call signature of a compiled loss is checked against eager (``pml_suprank.losses.compile_guard``):
a compiled loss made wrong on purpose — a ``torch.compile`` backend that zeroes the backward's gradients or scales
the forward's output — is refused with an error naming the torch version and the way out; a correct compile passes
silently, with one extra eager call per call signature, and leaves the caller's gradients exactly those of eager.
``aot_eager``-based backends trace forward and backward without building C++ kernels."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from _helpers import parse_recipe, recipe_parser
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.backends.common import aot_autograd

from pml_suprank import losses
from pml_suprank.losses import CompiledLossMismatchError, check_compiled_loss, compile_loss
from pml_suprank.losses.compile_guard import GuardedCall, GuardedCompileMixin, relative_difference
from pml_suprank.training.loss_module import LossModule


def _boxed(run):
    run._boxed_call = True
    return run


def _zero_gradients(gm, example_inputs):
    """A backward compiler whose gradients are all zero (the failure of torch 2.11 on the hierarchical kernel)."""

    def run(args):
        return [None if g is None else g * 0 for g in gm(*args)]

    return _boxed(run)


def _scale_loss(gm, example_inputs):
    """A forward compiler that returns the loss times 1.01 (its saved tensors untouched)."""

    def run(args):
        outs = list(gm(*args))
        outs[0] = outs[0] * 1.01
        return outs

    return _boxed(run)


def _nop(gm, example_inputs):
    return make_boxed_func(gm)


ZERO_GRAD = aot_autograd(fw_compiler=_nop, bw_compiler=_zero_gradients)
WRONG_VALUE = aot_autograd(fw_compiler=_scale_loss, bw_compiler=_nop)


def _batch(batch: int = 16, dim: int = 16, hierarchical: bool = True):
    g = torch.Generator().manual_seed(0)
    emb = F.normalize(torch.randn(batch, dim, generator=g), dim=1)
    fine = torch.arange(batch) // 4
    return emb, torch.stack([fine, fine // 2], 1) if hierarchical else fine


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["SupHAPLoss", "HAPPIERLoss"])
@pytest.mark.slow
def test_loss_compile_with_a_zeroed_gradient_is_refused(name):
    emb, labels = _batch()
    kwargs = {"num_classes": 8, "embedding_size": 16} if name == "HAPPIERLoss" else {}
    loss_fn = getattr(losses, name)(kernel="dense", **kwargs)
    loss_fn.compile(backend=ZERO_GRAD, fullgraph=True)
    with pytest.raises(CompiledLossMismatchError) as err:
        loss_fn(emb.clone().requires_grad_(True), labels)
    message = str(err.value)
    assert f"torch {torch.__version__}" in message and "--compile_loss false" in message
    assert "call the loss uncompiled" in message.lower() and f"compiled {name}" in message
    assert "loss value 0," in message and "embedding gradient 1" in message  # value right, gradient gone


def test_every_loss_of_the_package_compiles_with_the_guard():
    classes = [getattr(losses, n) for n in losses.__all__ if isinstance(getattr(losses, n), type)]
    modules = [c for c in classes if issubclass(c, nn.Module) and c is not losses.DistributedRankLoss]  # a wrapper
    assert len(modules) == 14 and all(issubclass(c, GuardedCompileMixin) for c in modules)
    emb, labels = _batch(hierarchical=False)
    loss_fn = losses.CalibrationLoss()
    loss_fn.compile(backend=ZERO_GRAD, fullgraph=True)
    with pytest.raises(CompiledLossMismatchError, match="compiled CalibrationLoss"):
        loss_fn(emb.clone().requires_grad_(True), labels)


def test_a_wrong_compiled_value_is_refused_without_gradients():
    emb, labels = _batch(hierarchical=False)
    loss_fn = losses.SupAPLoss(kernel="dense")
    loss_fn.compile(backend=WRONG_VALUE, fullgraph=True)
    with torch.no_grad(), pytest.raises(CompiledLossMismatchError, match=r"loss value 0\.0099"):
        loss_fn(emb, labels)


@pytest.mark.slow
def test_the_gradient_is_checked_at_the_first_call_that_has_one():
    """A first call without gradients checks the value only; the gradient is checked at the first training call."""
    emb, labels = _batch(hierarchical=False)
    loss_fn = losses.SupAPLoss(kernel="dense")
    loss_fn.compile(backend=ZERO_GRAD, fullgraph=True)
    with torch.no_grad():
        loss_fn(emb, labels)
    loss_fn(emb, labels)  # no gradient wanted by this call either: passes (another grad mode: checked too)
    guard = loss_fn._compiled_call_impl
    assert len(guard.checked) == 2 and guard.eager_calls == 2
    with pytest.raises(CompiledLossMismatchError, match="embedding gradient 1[ ,]"):
        loss_fn(emb.clone().requires_grad_(True), labels)


@pytest.mark.parametrize("name", ["SupHAPLoss", "HAPPIERLoss", "SupAPLoss"])
@pytest.mark.slow
def test_a_correct_compile_passes_silently_with_one_extra_eager_call(name):
    hierarchical = name != "SupAPLoss"
    emb, labels = _batch(hierarchical=hierarchical)
    kwargs = {"num_classes": 8, "embedding_size": 16} if name == "HAPPIERLoss" else {}
    loss_fn = getattr(losses, name)(kernel="dense", **kwargs).double()
    emb = emb.double()
    x_eager = emb.clone().requires_grad_(True)
    expected = loss_fn(x_eager, labels)
    expected.backward()
    eager_param_grads = [p.grad.clone() for p in loss_fn.parameters()]
    loss_fn.zero_grad()
    loss_fn.compile(backend="aot_eager", fullgraph=True)
    assert isinstance(loss_fn._compiled_call_impl, GuardedCall)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            for p in loss_fn.parameters():
                p.grad = None
            x = emb.clone().requires_grad_(True)
            value = loss_fn(x, labels)
            value.backward()
            torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(x.grad, x_eager.grad, rtol=1e-10, atol=1e-12)  # not doubled by the check
            for p, g in zip(loss_fn.parameters(), eager_param_grads, strict=True):
                torch.testing.assert_close(p.grad, g, rtol=1e-10, atol=1e-12)
    assert not [w for w in caught if "pml_suprank" in w.filename]  # silent (torch's own tracing warnings aside)
    guard = loss_fn._compiled_call_impl
    assert len(guard.checked) == 1 and guard.eager_calls == 1
    assert float(x.grad.abs().max()) > 1e-4


@pytest.mark.slow
def test_loss_module_of_a_model_gets_eager_gradients_or_the_refusal():
    """Through the recipes' LossModule: the model's gradients after a guarded compiled step equal eager ones (the
    check's ``autograd.grad`` accumulates nothing), and a zeroed compiled gradient is refused."""
    emb, labels = _batch()
    model = nn.Linear(16, 16).double()
    images = emb.double()

    def model_grads(loss_fn):
        model.zero_grad()
        LossModule(model, loss_fn)(images, labels).backward()
        return [p.grad.clone() for p in model.parameters()]

    expected = model_grads(losses.SupHAPLoss(kernel="dense"))
    guarded = compile_loss(losses.SupHAPLoss(kernel="dense"), backend="aot_eager", fullgraph=True)
    for got, want in zip(model_grads(guarded), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    wrong = compile_loss(losses.SupHAPLoss(kernel="dense"), backend=ZERO_GRAD, fullgraph=True)
    with pytest.raises(CompiledLossMismatchError, match="--compile_loss false"):
        model_grads(wrong)


def test_compile_loss_guards_any_module_loss():
    """``compile_loss`` (the recipes' ``--compile_loss``) guards a loss that is not one of the package's."""
    emb, labels = _batch(hierarchical=False)

    class Custom(nn.Module):
        def forward(self, embeddings, labels):
            return (embeddings @ embeddings.T).sigmoid().mean()

    loss_fn = compile_loss(Custom(), backend=ZERO_GRAD)
    with pytest.raises(CompiledLossMismatchError, match="compiled Custom"):
        loss_fn(emb.clone().requires_grad_(True), labels)
    with pytest.raises(TypeError, match="compile_loss needs an nn.Module loss; got function"):
        compile_loss(lambda e, l: e.sum())


def test_recipe_compile_loss_installs_the_guard():
    pytest.importorskip("timm", reason="the recipes need the recipes extra")
    common, parser = recipe_parser("train_happier")
    spec = parse_recipe(parser, ["--compile_loss", "true", "--kernel", "dense"])
    loss_fn = common.make_loss(spec, num_classes=8, embedding_size=16)
    assert isinstance(loss_fn._compiled_call_impl, GuardedCall)
    assert loss_fn._compiled_call_impl.module() is loss_fn
    assert getattr(common.make_loss(parse_recipe(parser, []), 8, 16), "_compiled_call_impl", None) is None


@pytest.mark.slow
def test_check_compiled_loss_after_torch_compile():
    emb, labels = _batch()
    loss_fn = losses.SupNDCGLoss(kernel="dense")
    x = emb.clone().requires_grad_(True)
    value = check_compiled_loss(torch.compile(loss_fn, backend="aot_eager", fullgraph=True), x, labels)
    torch.testing.assert_close(value, loss_fn(emb, labels), rtol=1e-6, atol=1e-7)
    value.backward()  # the caller's graph is intact
    assert float(x.grad.abs().max()) > 1e-4
    with pytest.raises(CompiledLossMismatchError, match="compiled SupNDCGLoss"):
        check_compiled_loss(torch.compile(loss_fn, backend=ZERO_GRAD), emb.clone().requires_grad_(True), labels)
    with pytest.raises(TypeError, match="needs eager="):
        check_compiled_loss(torch.compile(lambda e, l: loss_fn(e, l), backend="aot_eager"), emb, labels)


@pytest.mark.slow
def test_ref_emb_that_is_the_batch_stays_the_batch_in_the_eager_reference():
    """``ref_emb=embeddings`` means "the batch is the reference set" (the query is left out by index): the eager
    reference gets the same identity, so a correct compile passes."""
    emb, labels = _batch(hierarchical=False)
    loss_fn = compile_loss(losses.SupAPLoss(kernel="dense"), backend="aot_eager", fullgraph=True)
    x = emb.clone().requires_grad_(True)
    value = loss_fn(x, labels, ref_emb=x, ref_labels=labels)
    torch.testing.assert_close(value, losses.SupAPLoss(kernel="dense")(emb, labels), rtol=1e-6, atol=1e-7)


def test_relative_difference():
    a = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert relative_difference(a, a.clone()) == 0.0
    assert relative_difference(a, torch.zeros(2)) == 1.0
    assert relative_difference(torch.zeros(2), torch.zeros(2)) == 0.0
    assert relative_difference(None, torch.zeros(2)) == 0.0 and relative_difference(a, None) == 1.0
    assert relative_difference(a, a * 1.001) == pytest.approx(0.001 / 1.001)
    assert relative_difference(a, torch.tensor([3.0, float("nan")])) == float("inf")
    assert relative_difference(a, torch.ones(3)) == float("inf")


class _ProxyLoss(nn.Module):
    """A loss with its own parameters (proxies): cross-entropy of the cosine to each class proxy."""

    def __init__(self, num_classes: int = 4, dim: int = 16) -> None:
        super().__init__()
        self.proxies = nn.Parameter(torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(1)))

    def forward(self, embeddings, labels, proxies=None):
        proxies = self.proxies if proxies is None else proxies
        return F.cross_entropy(embeddings @ F.normalize(proxies, dim=1).T * 8, labels)


def _proxy_batch(batch: int):
    g = torch.Generator().manual_seed(batch)
    return F.normalize(torch.randn(batch, 16, generator=g), dim=1).requires_grad_(True), torch.arange(batch) % 4


def test_a_graph_that_diverges_after_a_recompile_is_refused():
    """The last, smaller batch is a new graph: it is checked too (once per call signature, not at every call)."""
    loss_fn = _ProxyLoss()

    def compiled(emb, labels):  # right for the batch of 8, wrong for any other (a bad recompile)
        value = loss_fn._call_impl(emb, labels)
        return value if emb.shape[0] == 8 else value * 2

    guard = GuardedCall(compiled, loss_fn)
    for _ in range(3):
        guard(*_proxy_batch(8))
    assert guard.eager_calls == 1
    with pytest.raises(CompiledLossMismatchError, match=r"loss value 0\.5"):
        guard(*_proxy_batch(6))


def test_a_missing_or_wrong_gradient_of_the_loss_parameters_is_refused():
    loss_fn = _ProxyLoss()
    detached = GuardedCall(lambda emb, labels: loss_fn._call_impl(emb, labels, loss_fn.proxies.detach()), loss_fn)
    with pytest.raises(CompiledLossMismatchError, match="gradient of proxies 1 "):
        detached(*_proxy_batch(8))
    emb, labels = _proxy_batch(8)
    with pytest.raises(CompiledLossMismatchError, match="gradient of proxies 1 "):
        detached(emb.detach(), labels)
    right = GuardedCall(lambda emb, labels: loss_fn._call_impl(emb, labels), loss_fn)
    value = right(emb, labels)
    value.backward()
    assert loss_fn.proxies.grad is not None and float(loss_fn.proxies.grad.abs().max()) > 0  # caller's grads intact


def test_a_tuple_return_is_checked():
    loss_fn = _ProxyLoss()

    def compiled(emb, labels):
        return loss_fn._call_impl(emb, labels) * 3, {"n": emb.shape[0]}

    class Eager(nn.Module):
        def forward(self, emb, labels):
            return loss_fn._call_impl(emb, labels), {"n": emb.shape[0]}

    eager = Eager()
    eager.proxies = loss_fn.proxies
    with pytest.raises(CompiledLossMismatchError, match=r"loss value 0\.667"):
        GuardedCall(compiled, eager)(*_proxy_batch(8))


def test_a_non_finite_batch_in_eager_too_is_left_to_the_non_finite_step_handling():
    """NaN embeddings (a diverged model): compiled and eager both NaN is no mismatch; the signature is judged at the
    next finite batch."""
    loss_fn = _ProxyLoss()
    guard = GuardedCall(lambda emb, labels: loss_fn._call_impl(emb, labels), loss_fn)
    emb, labels = _proxy_batch(8)
    value = guard(torch.full_like(emb, float("nan")).requires_grad_(True), labels)
    assert not torch.isfinite(value) and not guard.checked
    guard(emb, labels)
    assert len(guard.checked) == 1 and guard.eager_calls == 2
