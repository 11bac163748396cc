"""pml_suprank.metrics.landmark: GLDv2 mAP@k and the revisited Oxford / Paris protocol against hand-computed cases,
a transcription of the protocol's published evaluation loop, pessimistic ties and argument errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pml_suprank.metrics.landmark import (
    REVISITED_SETUPS,
    landmark_map_at_k,
    revisited_ground_truth,
    revisited_map,
    revisited_setup_masks,
)

DESCENDING = torch.tensor([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]])


def _bool(rows):
    return torch.tensor(rows, dtype=torch.bool)


# ------------------------------------------------------------------------------------------------------------------
# GLDv2 mAP@k


def test_map_at_k_hand_computed():
    positives = _bool([[False, True, False, True, False, False]])  # ranks 2 and 4
    assert landmark_map_at_k(DESCENDING, positives).tolist() == pytest.approx([(1 / 2 + 2 / 4) / 2])
    assert landmark_map_at_k(DESCENDING, positives, k=2).tolist() == pytest.approx([(1 / 2) / 2])  # min(2, k) = 2
    assert landmark_map_at_k(DESCENDING, positives, k=1).tolist() == [0.0]
    three = _bool([[True, True, True, False, False, False]])  # m = 3 > k = 2: divided by k
    assert landmark_map_at_k(DESCENDING, three, k=2).tolist() == [1.0]


def test_map_at_k_junk_is_removed_from_the_ranking():
    positives = _bool([[False, True, False, True, False, False]])
    junk = _bool([[True, False, False, False, False, False]])  # ranking 1, 2, 3, 4, 5: positives at 1 and 3
    assert landmark_map_at_k(DESCENDING, positives, junk).tolist() == pytest.approx([(1 + 2 / 3) / 2])
    both = _bool([[False, True, False, False, False, False]])  # a junk positive stays a positive
    assert landmark_map_at_k(DESCENDING, positives, junk | both).tolist() == pytest.approx([(1 + 2 / 3) / 2])


def test_map_at_k_pessimistic_ties_and_queries_without_positives():
    scores = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.1, 0.2, 0.3, 0.4]])
    positives = _bool([[True, False, False, False], [False, False, False, False]])
    out = landmark_map_at_k(scores, positives)
    assert out[0].item() == pytest.approx(1 / 4)  # the tied positive is ranked after the three negatives
    assert math.isnan(out[1].item())
    assert torch.nanmean(out).item() == pytest.approx(0.25)


def test_map_at_k_from_hierarchical_labels():
    """H-GLDv2: positives are the gallery images of the query's landmark (label column 0)."""
    query = torch.tensor([[0, 0, 0], [1, 1, 1]])
    gallery = torch.tensor([[0, 0, 0], [2, 0, 0], [1, 1, 1], [0, 0, 0]])
    scores = torch.tensor([[0.9, 0.95, 0.1, 0.3], [0.2, 0.1, 0.8, 0.9]])
    positives = query[:, None, 0] == gallery[None, :, 0]
    # query 0: ranking 1, 0, 3, 2 -> positives at 2, 3; query 1: ranking 3, 2, 0, 1 -> positive at 2
    expected = [(1 / 2 + 2 / 3) / 2, 1 / 2]
    assert landmark_map_at_k(scores, positives).tolist() == pytest.approx(expected)


def test_map_at_k_argument_errors():
    positives = _bool([[True, False, False, False, False, False]])
    with pytest.raises(ValueError, match=r"k must be a positive int; got 0"):
        landmark_map_at_k(DESCENDING, positives, k=0)
    with pytest.raises(TypeError, match=r"positives must be a bool torch\.Tensor"):
        landmark_map_at_k(DESCENDING, positives.long())
    with pytest.raises(ValueError, match=r"junk must have the shape of scores \(1, 6\); got shape \(1, 5\)"):
        landmark_map_at_k(DESCENDING, positives, positives[:, :5])
    with pytest.raises(TypeError, match=r"scores must be a torch\.Tensor"):
        landmark_map_at_k(DESCENDING.tolist(), positives)


# ------------------------------------------------------------------------------------------------------------------
# revisited Oxford / Paris

SCORES8 = torch.tensor([[1.0 - i / 10 for i in range(8)], [1.0 - i / 10 for i in range(8)]])
GND = [
    {"easy": [1, 5], "hard": [3], "junk": [0, 6]},
    {"easy": np.array([0]), "hard": np.array([], dtype=np.int64), "junk": []},  # no hard image: left out of Hard
]


def test_revisited_hand_computed():
    out = revisited_map(SCORES8, GND, per_query=True)
    # Easy, query 0: positives {1, 5}, ignored {0, 6, 3}: kept 1, 2, 4, 5, 7 -> positives at 0-based 0 and 3:
    # trapezoids (1 + 1) / 2 and (1/3 + 2/4) / 2, AP = (1 + 5/12) / 2; mP@1 = 1, mP@5 = mP@10 = 2 / min(4, k) = 1/2
    easy_q0 = (1 + 5 / 12) / 2
    # Medium, query 0: positives {1, 3, 5}, ignored {0, 6}: positives at 0, 2, 4
    medium_q0 = (1 + (1 / 2 + 2 / 3) / 2 + (2 / 4 + 3 / 5) / 2) / 3
    # Hard, query 0: positive {3}, ignored {0, 1, 5, 6}: kept 2, 3, 4, 7 -> position 1: (0/1 + 1/2) / 2
    hard_q0 = 1 / 4
    assert out["easy_ap"].tolist() == pytest.approx([easy_q0, 1.0])
    assert out["medium_ap"].tolist() == pytest.approx([medium_q0, 1.0])
    assert out["hard_ap"][0].item() == pytest.approx(hard_q0) and math.isnan(out["hard_ap"][1].item())
    assert out["easy_map"] == pytest.approx((easy_q0 + 1) / 2)
    assert out["medium_map"] == pytest.approx((medium_q0 + 1) / 2)
    assert out["hard_map"] == pytest.approx(hard_q0)  # the query without a hard image is left out
    assert [out[f"easy_mp@{k}"] for k in (1, 5, 10)] == pytest.approx([1.0, 0.75, 0.75])
    assert [out[f"medium_mp@{k}"] for k in (1, 5, 10)] == pytest.approx([1.0, 0.8, 0.8])  # (1 + 3/5) / 2
    assert [out[f"hard_mp@{k}"] for k in (1, 5, 10)] == pytest.approx([0.0, 0.5, 0.5])  # 1 / min(2, k)
    assert out["easy_mp"].shape == (2, 3)


def _protocol_loop(scores: np.ndarray, gnd: list[dict], kappas=(1, 5, 10)) -> tuple[float, np.ndarray]:
    """The protocol's evaluation loop, transcribed: ranks by sorting, positives shifted by the junk ranked before them,
    trapezoidal AP, capped precision."""
    order = np.argsort(-scores, axis=1)
    aps, prs = [], []
    for q, entry in enumerate(gnd):
        ok, junk = np.asarray(entry["ok"]), np.asarray(entry["junk"])
        if len(ok) == 0:
            continue
        pos = np.flatnonzero(np.isin(order[q], ok))
        junk_pos = np.flatnonzero(np.isin(order[q], junk))
        pos = pos - np.array([(junk_pos < p).sum() for p in pos])
        ap = 0.0
        for j, rank in enumerate(pos):
            precision_0 = 1.0 if rank == 0 else j / rank
            ap += (precision_0 + (j + 1) / (rank + 1)) / (2 * len(ok))
        aps.append(ap)
        pos1 = pos + 1
        prs.append([(pos1 <= min(pos1.max(), k)).sum() / min(pos1.max(), k) for k in kappas])
    return float(np.mean(aps)), np.mean(prs, axis=0)


def test_revisited_matches_the_protocol_loop_on_random_data():
    rng = np.random.default_rng(0)
    num_queries, num_items = 7, 60
    scores = rng.standard_normal((num_queries, num_items))
    gnd = []
    for _ in range(num_queries):
        items = rng.permutation(num_items)
        sizes = rng.integers(0, 8, 3)
        gnd.append(
            {
                "easy": items[: sizes[0]],
                "hard": items[sizes[0] : sizes[0] + sizes[1]],
                "junk": items[sizes[0] + sizes[1] : sizes.sum()],
            }
        )
    gnd[0]["easy"] = items[:3]  # at least one query with positives in every setup
    gnd[0]["hard"] = items[3:5]
    out = revisited_map(torch.from_numpy(scores), gnd)
    for setup, (positive_keys, ignored_keys) in REVISITED_SETUPS.items():
        loop_gnd = [
            {
                "ok": np.concatenate([e[k] for k in positive_keys]),
                "junk": np.concatenate([e[k] for k in ignored_keys]),
            }
            for e in gnd
        ]
        mean_ap, mean_pr = _protocol_loop(scores, loop_gnd)
        assert out[f"{setup}_map"] == pytest.approx(mean_ap), setup
        assert [out[f"{setup}_mp@{k}"] for k in (1, 5, 10)] == pytest.approx(mean_pr.tolist()), setup


def test_revisited_pessimistic_ties():
    scores = torch.zeros(1, 4)
    out = revisited_map(scores, [{"easy": [0], "hard": [], "junk": [1]}], kappas=(1, 3))
    # kept items 0, 2, 3 all tied: the positive is ranked last (0-based 2): (0/2 + 1/3) / 2
    assert out["easy_map"] == pytest.approx((1 / 3) / 2)
    assert out["easy_mp@1"] == 0.0 and out["easy_mp@3"] == pytest.approx(1 / 3)
    assert math.isnan(out["hard_map"])


def test_setup_masks_follow_the_protocol_table():
    membership = revisited_ground_truth([{"easy": [0], "hard": [1], "junk": [2]}], 4)
    expected = {"easy": ([0], [1, 2]), "medium": ([0, 1], [2]), "hard": ([1], [0, 2])}
    for setup, (pos, ign) in expected.items():
        positives, ignored = revisited_setup_masks(membership, setup)
        assert positives[0].nonzero().flatten().tolist() == pos and ignored[0].nonzero().flatten().tolist() == ign
    with pytest.raises(ValueError, match=r"setup must be one of \['easy', 'medium', 'hard'\]; got 'all'"):
        revisited_setup_masks(membership, "all")


def test_revisited_argument_errors():
    with pytest.raises(ValueError, match=r"gnd must give one entry per query \(scores has 2 rows\); got 1"):
        revisited_map(SCORES8, GND[:1])
    with pytest.raises(ValueError, match=r"gnd\[1\]\['junk'\] holds indices outside \[0, 8\)"):
        revisited_map(SCORES8, [GND[0], {"easy": [0], "hard": [], "junk": [8]}])
    with pytest.raises(ValueError, match=r"gnd\[0\] has no 'hard' list"):
        revisited_map(SCORES8[:1], [{"easy": [0]}])
    with pytest.raises(ValueError, match=r"gnd\[0\]\['easy'\] must hold integer database indices; got 0\.5"):
        revisited_map(SCORES8[:1], [{"easy": [0.5], "hard": []}])
    with pytest.raises(ValueError, match=r"kappas must be a sequence of positive ints; got \(0,\)"):
        revisited_map(SCORES8, GND, kappas=(0,))
    with pytest.raises(TypeError, match=r"gnd must be a sequence of per-query mappings; got dict"):
        revisited_map(SCORES8, {"gnd": GND})
    with pytest.raises(TypeError, match=r"scores must be a \(Q, N\) torch\.Tensor"):
        revisited_map(SCORES8[0], GND)


def test_map_at_100_agrees_with_the_evaluator_on_a_query_gallery_pair():
    """H-GLDv2 protocol: the evaluator's map_at_100 (query vs gallery, fine level) is the GLDv2 mAP@100."""
    from pml_suprank.metrics import RetrievalEvaluator

    generator = torch.Generator().manual_seed(0)
    query = torch.nn.functional.normalize(torch.randn(20, 8, generator=generator), dim=1)
    gallery = torch.nn.functional.normalize(torch.randn(150, 8, generator=generator), dim=1)
    fine_q, fine_g = torch.randint(0, 6, (20,), generator=generator), torch.randint(0, 8, (150,), generator=generator)
    query_labels, gallery_labels = torch.stack([fine_q, fine_q // 3], 1), torch.stack([fine_g, fine_g // 3], 1)
    out = RetrievalEvaluator(k_values=(100,), metrics=["map_at_k"]).evaluate(
        query, query_labels, gallery, gallery_labels
    )
    ours = landmark_map_at_k(query @ gallery.T, query_labels[:, None, 0] == gallery_labels[None, :, 0], k=100)
    assert out["map_at_100"] == pytest.approx(torch.nanmean(ours).item())
