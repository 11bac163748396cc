import math

import pytest
import torch
from _rank_golden import (
    DTYPES,
    TOL,
    assert_golden,
    dense_supap,
    golden_case,
    raw_dot,
    run_golden,
    true_ap,
)
from pytorch_metric_learning.reducers import DoNothingReducer
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from pml_suprank import losses
from pml_suprank.losses._inputs import RankInputs
from pml_suprank.ranking.steps import default_offset

INPUTS = ["A_b12_L2", "B_b16_L3_singletons", "C_b12_L2_ties", "D_b8_mem32_L2"]
VARIANTS = {
    "SupAP_sop": {"offset": 1.44},
    "SupAP_inat": {"offset": 1.0, "start": 0.0},
    "SupAP_classdefaults": {},
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("inp", INPUTS)
def test_golden_loss_and_gradient(inp, variant, dtype):
    kwargs = VARIANTS[variant]
    loss, grad, res = run_golden(
        f"{inp}/{variant}", lambda: losses.SupAPLoss(include_self=True, distance=raw_dot(), **kwargs), dtype
    )
    assert_golden(loss, grad, res, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("inp", INPUTS)
def test_golden_per_query_scores(inp, dtype):
    case, data = golden_case(f"{inp}/SupAP_sop")
    emb = torch.tensor(data["embeddings"], dtype=dtype)
    labels = torch.tensor(data["labels"])[:, 0]
    kwargs = {}
    if "ref_embeddings" in data:
        kwargs = {
            "ref_emb": torch.tensor(data["ref_embeddings"], dtype=dtype),
            "ref_labels": torch.tensor(data["ref_labels"])[:, 0],
        }
    loss_fn = losses.SupAPLoss(offset=1.44, include_self=True, distance=raw_dot(), reducer=DoNothingReducer())
    out = loss_fn(emb, labels, **kwargs)["loss"]
    expected = case["results"]["float64" if dtype == torch.float64 else "float32"]["per_query_score"]
    torch.testing.assert_close(1 - out["losses"], torch.tensor(expected, dtype=dtype), atol=TOL[dtype], rtol=0)
    assert torch.equal(out["indices"], torch.arange(len(labels)))


def test_golden_ranks_float64():
    case, data = golden_case("C_b12_L2_ties/SupAP_sop")
    res = case["results"]["float64"]
    loss_fn = losses.SupAPLoss(offset=1.44, include_self=True, distance=raw_dot())
    emb = torch.tensor(data["embeddings"], dtype=torch.float64)
    labels = torch.tensor(data["labels"])[:, 0]
    inputs = loss_fn.rank_inputs(emb, labels, None, emb, labels)
    from pml_suprank.losses.sup_ap_loss import grouped_suprank_pair_ranks

    q, i, rank_plus, rank, _ = grouped_suprank_pair_ranks(inputs, loss_fn.step)
    expected_rank = torch.tensor(res["rank"], dtype=torch.float64)
    expected_plus = torch.tensor(res["rank_plus"], dtype=torch.float64)
    torch.testing.assert_close(rank, expected_rank[q, i], atol=1e-10, rtol=0)
    torch.testing.assert_close(rank_plus, expected_plus[q, i], atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_golden_memory_case_batch_plus_memory(dtype):
    """D/SupAP_sop_batch_plus_memory = (L(ref=batch) + L(ref=memory)) / 2, the reference XBM loss."""
    case, data = golden_case("D_b8_mem32_L2/SupAP_sop_batch_plus_memory")
    res = case["results"]["float64" if dtype == torch.float64 else "float32"]
    emb = torch.tensor(data["embeddings"], dtype=dtype, requires_grad=True)
    labels = torch.tensor(data["labels"])[:, 0]
    ref = torch.tensor(data["ref_embeddings"], dtype=dtype)
    ref_labels = torch.tensor(data["ref_labels"])[:, 0]
    loss_fn = losses.SupAPLoss(offset=1.44, include_self=True, distance=raw_dot())
    loss = (loss_fn(emb, labels) + loss_fn(emb, labels, ref_emb=ref, ref_labels=ref_labels)) / 2
    loss.backward()
    assert_golden(loss.detach(), emb.grad, res, dtype)


def test_reference_force_general_nan_is_finite_here():
    """The reference per-query path returns NaN (golden A/SupAP_sop_force_general); ours is finite and equal to
    the dense path, whose gradient the reference shares."""
    case, _ = golden_case("A_b12_L2/SupAP_sop_force_general")
    assert math.isnan(case["results"]["float64"]["loss"])
    loss, grad, _ = run_golden(
        "A_b12_L2/SupAP_sop_force_general",
        lambda: losses.SupAPLoss(offset=1.44, include_self=True, distance=raw_dot()),
        torch.float64,
    )
    _, _, res_dense = run_golden(
        "A_b12_L2/SupAP_sop",
        lambda: losses.SupAPLoss(offset=1.44, include_self=True, distance=raw_dot()),
        torch.float64,
    )
    assert abs(loss.item() - res_dense["loss"]) <= 1e-10
    expected_grad = torch.tensor(case["results"]["float64"]["grad_embeddings"], dtype=torch.float64)
    assert (grad - expected_grad).abs().max() <= 1e-10


def test_hand_computed_case():
    """One query (score 1·x), positives at 0.9 and 0.5, one negative at 0.7, default H⁻."""
    emb = torch.tensor([[1.0]], dtype=torch.float64)
    ref = torch.tensor([[0.9], [0.5], [0.7]], dtype=torch.float64)
    loss = losses.SupAPLoss(distance=raw_dot())(emb, torch.tensor([0]), ref_emb=ref, ref_labels=torch.tensor([0, 0, 1]))
    offset = default_offset(0.01, 0.05, 0.5)
    rank_top = 1 + 1 / (1 + math.exp(20.0))  # negative 0.2 below: σ((0.7 − 0.9)/τ)
    rank_low = 2 + 100 * (0.2 - 0.05) + offset  # the negative is 0.2 above the second positive
    expected = 1 - (1 / rank_top + 2 / rank_low) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-12)


def test_default_offset_is_continuous():
    loss_fn = losses.SupAPLoss()
    assert loss_fn.offset == pytest.approx(1 / (1 + math.exp(-5)) + 0.5, abs=1e-7)
    assert losses.SupAPLoss(offset=1.44).offset == 1.44


def _random_problem(seed, b=10, n=30, classes=4, dtype=torch.float64, dim=16):
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(b, dim, generator=g, dtype=dtype), dim=1)
    ref = torch.nn.functional.normalize(torch.randn(n, dim, generator=g, dtype=dtype), dim=1)
    labels = torch.randint(0, classes, (b,), generator=g)
    ref_labels = torch.randint(0, classes, (n,), generator=g)
    return emb, labels, ref, ref_labels


@pytest.mark.parametrize("seed", range(5))
def test_matches_dense_implementation_and_upper_bounds_one_minus_ap(seed):
    emb, labels, ref, ref_labels = _random_problem(seed)
    loss_fn = losses.SupAPLoss(reducer=DoNothingReducer())
    out = loss_fn(emb, labels, ref_emb=ref, ref_labels=ref_labels)["loss"]
    scores = emb @ ref.t()
    valid = torch.ones_like(scores, dtype=torch.bool)
    pos = labels[:, None] == ref_labels[None, :]
    dense = dense_supap(scores, valid, pos)
    kept = pos.any(1)
    assert torch.equal(out["indices"], torch.nonzero(kept).squeeze(1))
    torch.testing.assert_close(out["losses"], dense[kept], atol=1e-12, rtol=0)
    one_minus_ap = 1 - true_ap(scores[kept], valid[kept], pos[kept])
    assert (out["losses"] >= one_minus_ap - 1e-12).all()


def test_float64_gradcheck():
    emb, labels, ref, ref_labels = _random_problem(0, b=4, n=8, classes=2, dim=4)
    emb.requires_grad_(True)
    ref.requires_grad_(True)
    loss_fn = losses.SupAPLoss(tau=0.05)
    assert torch.autograd.gradcheck(lambda e, r: loss_fn(e, labels, ref_emb=r, ref_labels=ref_labels), (emb, ref))
    emb2 = emb.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: loss_fn(e, labels), (emb2,))


def test_gradient_signs_on_scores():
    """Positives' scores are pushed up (dL/ds <= 0), violating negatives down (dL/ds >= 0)."""
    g = torch.Generator().manual_seed(3)
    scores = (torch.rand(6, 20, generator=g, dtype=torch.float64) * 0.4).requires_grad_(True)
    labels = torch.arange(6) % 3
    ref_labels = torch.arange(20) % 3
    loss_fn = losses.SupAPLoss()
    inputs = RankInputs(scores, torch.ones(6, 20, dtype=torch.bool), labels, ref_labels, same_source=False)
    per_query, _ = loss_fn.compute_query_losses(inputs)
    per_query.sum().backward()
    pos = labels[:, None] == ref_labels[None, :]
    assert (scores.grad[pos] <= 0).all() and (scores.grad[pos] < 0).any()
    assert (scores.grad[~pos] >= 0).all() and (scores.grad[~pos] > 0).any()


def test_invariant_to_item_order():
    emb, labels, ref, ref_labels = _random_problem(1, b=12, n=12)
    loss_fn = losses.SupAPLoss()
    e1 = emb.clone().requires_grad_(True)
    l1 = loss_fn(e1, labels)
    l1.backward()
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    e2 = emb[perm].clone().requires_grad_(True)
    l2 = loss_fn(e2, labels[perm])
    l2.backward()
    assert l1.item() == pytest.approx(l2.item(), abs=1e-12)
    torch.testing.assert_close(e2.grad, e1.grad[perm], atol=1e-12, rtol=0)


def test_in_batch_equals_memory_with_self_removed_by_indices_tuple():
    """ref_emb = a copy of the batch + all pairs but self (what CrossBatchMemory passes) == in-batch loss."""
    emb, labels, _, _ = _random_problem(2, b=12)
    loss_fn = losses.SupAPLoss()
    in_batch = loss_fn(emb, labels)
    a1, p, a2, n = lmu.get_all_pairs_indices(labels, labels.clone())
    keep = a1 != p
    memory = loss_fn(emb, labels, (a1[keep], p[keep], a2, n), emb.detach().clone(), labels.clone())
    assert in_batch.item() == pytest.approx(memory.item(), abs=1e-12)
    # without the indices_tuple the copies count as (top) positives: the reference (include_self) convention
    with_self = losses.SupAPLoss(include_self=True)(emb, labels)
    copies = loss_fn(emb, labels, None, emb.detach().clone(), labels.clone())
    assert with_self.item() == pytest.approx(copies.item(), abs=1e-12)


def test_queries_without_positive_are_dropped_and_zero_when_none():
    emb = torch.nn.functional.normalize(torch.randn(4, 8, dtype=torch.float64), dim=1).requires_grad_(True)
    out = losses.SupAPLoss(reducer=DoNothingReducer())(emb, torch.tensor([0, 0, 1, 2]))["loss"]
    assert out["indices"].tolist() == [0, 1]
    loss = losses.SupAPLoss()(emb, torch.tensor([0, 1, 2, 3]))
    assert loss.item() == 0.0
    loss.backward()
    assert emb.grad is not None and (emb.grad == 0).all()


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
def test_mixed_precision_is_finite_and_float32(low):
    emb, labels, _, _ = _random_problem(4, b=16, dtype=torch.float32)
    e = emb.to(low).requires_grad_(True)
    loss = losses.SupAPLoss()(e, labels)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert loss.item() == pytest.approx(losses.SupAPLoss()(emb, labels).item(), abs=2e-2)
    loss.backward()
    assert e.grad.dtype == low and torch.isfinite(e.grad.float()).all()


@pytest.mark.parametrize(
    "kwargs, exc",
    [({"tau": 0.0}, ValueError), ({"tau": "a"}, TypeError), ({"rho": -1.0}, ValueError), ({"offset": "x"}, TypeError)],
)
def test_bad_constructor_arguments(kwargs, exc):
    with pytest.raises(exc, match=next(iter(kwargs))):
        losses.SupAPLoss(**kwargs)
