"""Tests of the input helpers shared by the losses (pml_suprank/losses/_inputs.py)."""

from __future__ import annotations

import pytest
import torch

from pml_suprank.losses import SupHAPLoss
from pml_suprank.losses._inputs import (
    RankInputs,
    check_indices_tuple,
    fine_labels,
    prepare_inputs,
    reference_mask,
)
from pml_suprank.relevance import Hierarchy

TABLE = torch.tensor([[0, 0], [1, 0], [2, 1]])


def test_triplets_become_pairs_and_bounds_are_checked():
    a, p, n = torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 0])
    pairs = check_indices_tuple((a, p, n), 2, 5)
    assert [x.tolist() for x in pairs] == [[0, 1], [2, 3], [0, 1], [4, 0]]
    assert check_indices_tuple(None, 2, 5) is None
    with pytest.raises(ValueError, match="indexes ref_emb"):
        check_indices_tuple((a, p, torch.tensor([4, 5])), 2, 5)
    with pytest.raises(ValueError, match="equal lengths"):
        check_indices_tuple((a, p, n[:1]), 2, 5)


def test_prepare_inputs_resolves_the_reference_set_and_upcasts():
    emb = torch.randn(4, 3, dtype=torch.bfloat16)
    labels = torch.tensor([0, 0, 1, 1])
    e, lab, ref, ref_lab, same = prepare_inputs("X", emb, labels, None, None)
    assert same and ref is e and ref_lab is lab and e.dtype == torch.float32
    e, _, ref, _, same = prepare_inputs(
        "X", emb.float(), labels, torch.randn(5, 3, dtype=torch.float64), labels[:1].repeat(5)
    )
    assert not same and ref.dtype == e.dtype == torch.float32
    with pytest.raises(ValueError, match="X requires labels"):
        prepare_inputs("X", emb, None, None, None)
    with pytest.raises(ValueError, match="ref_labels must be None or equal to labels"):
        prepare_inputs("X", emb, labels, None, labels.flip(0))


def test_reference_mask_removes_self_only_for_the_batch():
    assert reference_mask(2, 3, torch.device("cpu"), same_source=True, include_self=False).tolist() == [
        [False, True, True],
        [True, False, True],
    ]
    assert reference_mask(2, 3, torch.device("cpu"), same_source=False, include_self=False).all()


def test_fine_labels_and_hierarchical_label_pair():
    two_d = TABLE[torch.tensor([0, 1, 2, 2])]
    assert torch.equal(fine_labels(two_d), torch.tensor([0, 1, 2, 2]))
    fine = torch.tensor([0, 2])
    assert fine_labels(fine) is fine

    def hierarchical_label_pair(labels, ref_labels, hierarchy, same_source):
        scores = torch.zeros(len(labels), len(ref_labels))
        inputs = RankInputs(scores, scores.bool(), labels, ref_labels, same_source)
        return SupHAPLoss(hierarchy=hierarchy).hierarchical_labels(inputs)

    levels, ref_levels, num = hierarchical_label_pair(fine, fine, Hierarchy(TABLE), same_source=True)
    assert num == 2 and ref_levels is levels and torch.equal(levels, TABLE[fine])
    levels, ref_levels, _ = hierarchical_label_pair(two_d[:2], two_d, None, same_source=False)
    assert torch.equal(ref_levels, two_d)
    with pytest.raises(ValueError, match="same number of levels"):
        hierarchical_label_pair(two_d, two_d[:, :1], None, same_source=False)
    with pytest.raises(ValueError, match="tree"):
        hierarchical_label_pair(torch.tensor([[0, 0], [0, 1]]), torch.tensor([[0, 0]]), None, same_source=False)
    with pytest.raises(ValueError, match="SupHAPLoss is a hierarchical loss"):
        hierarchical_label_pair(fine, fine, None, same_source=True)
