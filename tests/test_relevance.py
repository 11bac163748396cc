"""Tests of pml_suprank.relevance: hierarchy tables, tree checks, level matrix, relevance functions."""

from __future__ import annotations

import pytest
import torch
from _hierarchical_dense import binary_ap, dense_hap

from pml_suprank.relevance import (
    Hierarchy,
    as_hierarchical_labels,
    check_tree,
    level_counts,
    level_matrix,
    pop_relevance,
    property1_relevance,
)

# fine -> [fine, middle, coarse]
TABLE = torch.tensor([[0, 0, 0], [1, 0, 0], [2, 1, 0], [3, 2, 1], [4, 2, 1]])


def test_hierarchy_from_table_and_expand():
    h = Hierarchy(TABLE)
    assert h.num_levels == 3
    fine = torch.tensor([4, 0, 2])
    assert h.expand(fine).tolist() == [[4, 2, 1], [0, 0, 0], [2, 1, 0]]
    assert "num_levels=3" in repr(h)


def test_hierarchy_from_labels_roundtrip():
    labels = TABLE[torch.tensor([3, 3, 0, 4, 1, 2])]
    h = Hierarchy.from_labels(labels)
    assert torch.equal(h.table, TABLE)
    assert torch.equal(as_hierarchical_labels(labels[:, 0], h), labels)


def test_hierarchy_with_unused_rows():
    table = torch.tensor([[0, 0], [-1, -1], [2, 1]])
    h = Hierarchy(table)
    assert h.expand(torch.tensor([2, 0])).tolist() == [[2, 1], [0, 0]]
    with pytest.raises(ValueError, match="fine label 1"):
        h.expand(torch.tensor([1]))
    with pytest.raises(ValueError, match="fine label 7"):
        h.expand(torch.tensor([7]))


@pytest.mark.parametrize(
    "table, match",
    [
        (torch.tensor([[1, 0], [0, 0]]), "row 0"),  # row f must start with f
        (torch.tensor([[0, 0], [1, -2]]), "negative ancestor"),
    ],
)
def test_hierarchy_rejects_bad_tables(table, match):
    with pytest.raises(ValueError, match=match):
        Hierarchy(table)


def test_check_tree_names_the_offending_label():
    labels = torch.tensor([[0, 0, 0], [1, 0, 0], [1, 1, 0]])  # fine 1 has two middle parents
    with pytest.raises(ValueError, match=r"label 1 of level 0.*\[0, 1\]"):
        check_tree(labels)
    labels = torch.tensor([[0, 0, 0], [1, 0, 1]])  # middle 0 has two coarse parents
    with pytest.raises(ValueError, match="label 0 of level 1"):
        check_tree(labels)
    check_tree(TABLE)  # a tree passes


def test_as_hierarchical_labels_paths_agree():
    h = Hierarchy(TABLE)
    fine = torch.tensor([0, 3, 3, 1])
    two_d = TABLE[fine]
    assert torch.equal(as_hierarchical_labels(fine, h), two_d)
    assert torch.equal(as_hierarchical_labels(two_d, h), two_d)
    assert torch.equal(as_hierarchical_labels(two_d, TABLE), two_d)  # raw table accepted
    assert as_hierarchical_labels(fine).shape == (4, 1)  # no hierarchy: one level


def test_as_hierarchical_labels_errors():
    h = Hierarchy(TABLE)
    with pytest.raises(ValueError, match="has 2 levels but the hierarchy has 3"):
        as_hierarchical_labels(TABLE[:, :2], h)
    with pytest.raises(ValueError, match="disagree"):
        as_hierarchical_labels(torch.tensor([[3, 2, 0]]), h)
    with pytest.raises(ValueError, match="not a tree"):
        as_hierarchical_labels(torch.tensor([[0, 0], [0, 1]]))
    with pytest.raises(TypeError, match="integer dtype"):
        as_hierarchical_labels(torch.tensor([0.0, 1.0]))


def test_level_matrix_hand_computed():
    q = TABLE[torch.tensor([0, 3])]
    r = TABLE  # fine 0..4
    expected = torch.tensor([[3, 2, 1, 0, 0], [0, 0, 0, 3, 2]])
    assert torch.equal(level_matrix(q, r), expected)
    with pytest.raises(ValueError, match="same L"):
        level_matrix(q, r[:, :2])


def test_level_matrix_counts_from_the_coarsest():
    # not a tree: equal fine label under different coarse labels is level 0, not 1
    q = torch.tensor([[5, 0]])
    r = torch.tensor([[5, 1], [6, 0]])
    assert level_matrix(q, r).tolist() == [[0, 1]]


def test_level_counts_with_mask():
    levels = torch.tensor([[2, 2, 1, 0, 0], [0, 1, 1, 1, 2]])
    mask = torch.tensor([[False, True, True, True, True], [True] * 5])
    assert level_counts(levels, 2).tolist() == [[2, 1, 2], [1, 3, 1]]
    assert level_counts(levels, 2, mask=mask).tolist() == [[2, 1, 1], [1, 3, 1]]


def test_pop_relevance_hand_computed():
    counts = torch.tensor([[5, 3, 2, 1], [4, 0, 2, 1]])  # L = 3
    rel = pop_relevance(counts, alpha=1.0, dtype=torch.float64)
    expected = torch.tensor([[0, 1 / 9, 1 / 3, 1.0], [0, 0, 1 / 3, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(rel, expected)
    rel5 = pop_relevance(counts, alpha=5.0, dtype=torch.float64)
    torch.testing.assert_close(rel5[0], torch.tensor([0, (1 / 3) ** 5 / 3, (2 / 3) ** 5 / 2, 1.0], dtype=torch.float64))
    rel0 = pop_relevance(counts, alpha=0.0, dtype=torch.float64)
    torch.testing.assert_close(rel0[0], torch.tensor([0, 1 / 3, 1 / 2, 1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="alpha"):
        pop_relevance(counts, alpha=-1.0)


def test_property1_relevance_hand_computed():
    counts = torch.tensor([[5, 3, 2, 1]])  # |Ω+,1| = 6, |Ω+,2| = 3, |Ω+,3| = 1
    w = [0.2, 0.3, 0.5]
    rel = property1_relevance(counts, w, dtype=torch.float64)
    expected = torch.tensor([[0.0, 0.2 / 6, 0.2 / 6 + 0.3 / 3, 0.2 / 6 + 0.3 / 3 + 0.5 / 1]], dtype=torch.float64)
    torch.testing.assert_close(rel, expected)
    # the relevances of the relevant items sum to Σ w = 1 (supplementary Eqs. 48-56)
    assert (rel[0, 1:] * counts[0, 1:]).sum().item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="3 entries"):
        property1_relevance(counts, [0.5, 0.5])
    with pytest.raises(ValueError, match="non-negative"):
        property1_relevance(counts, [1.5, -0.5, 0.0])


@pytest.mark.parametrize("seed", range(4))
def test_sum_w_ap_equals_h_ap_with_property1_relevance(seed):
    """SupRank supplementary Property 1 (Eq. 57): ΣwAP = Σ_l w_l AP^(l) equals H-AP with the Eq. 44 relevance."""
    g = torch.Generator().manual_seed(seed)
    B, N, L = 6, 25, 3
    scores = torch.rand(B, N, generator=g, dtype=torch.float64)
    levels = torch.randint(0, L + 1, (B, N), generator=g)
    levels[:, 0] = L  # every query has relevant items at every level
    valid = torch.ones(B, N, dtype=torch.bool)
    w = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    rel = property1_relevance(level_counts(levels, L), w, dtype=torch.float64)
    h_ap = dense_hap(scores, levels, rel, exact=True)
    sum_w_ap = sum(w[l - 1] * binary_ap(scores, levels >= l, valid) for l in range(1, L + 1))
    torch.testing.assert_close(h_ap, sum_w_ap, rtol=1e-12, atol=1e-12)


def test_h_ap_with_one_level_is_ap():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(4, 20, generator=g, dtype=torch.float64)
    levels = torch.randint(0, 2, (4, 20), generator=g)
    levels[:, 0] = 1
    rel = pop_relevance(level_counts(levels, 1), 1.0, dtype=torch.float64)
    valid = torch.ones(4, 20, dtype=torch.bool)
    torch.testing.assert_close(dense_hap(scores, levels, rel, exact=True), binary_ap(scores, levels == 1, valid))


def test_as_hierarchy_wraps_tables_and_rejects_other_types():
    from pml_suprank.relevance import Hierarchy, as_hierarchy

    assert as_hierarchy(None) is None
    h = Hierarchy(torch.tensor([[0, 0], [1, 0], [2, 1]]))
    assert as_hierarchy(h) is h
    assert torch.equal(as_hierarchy(h.table).table, h.table)
    with pytest.raises(TypeError, match="hierarchy must be None"):
        as_hierarchy([[0, 0]])
