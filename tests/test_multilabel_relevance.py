"""Tests of pml_suprank.relevance.multilabel_relevance (Ramzi, PhD thesis, Algorithm 1) against a naive loop."""

from __future__ import annotations

import pytest
import torch

from pml_suprank.relevance import Hierarchy, level_matrix, multilabel_relevance

# fine -> [fine, middle, coarse]: 0,1 under middle 0; 2 under middle 1; 3,4 under middle 2; middles 0,1 under coarse 0
TABLE = torch.tensor([[0, 0, 0], [1, 0, 0], [2, 1, 0], [3, 2, 1], [4, 2, 1]])


def random_table(num_fine: int, num_levels: int, gen: torch.Generator) -> torch.Tensor:
    """A random tree as a ``(num_fine, L)`` table; coarser levels have fewer nodes (many LCA ties)."""
    table = torch.empty(num_fine, num_levels, dtype=torch.long)
    table[:, 0] = torch.arange(num_fine)
    size = num_fine
    for c in range(1, num_levels):
        size = max(1, size // 2)
        parent = torch.randint(0, size, (int(table[:, c - 1].max()) + 1,), generator=gen)
        table[:, c] = parent[table[:, c - 1]]
    return table


def random_multilabels(n: int, m: int, num_fine: int, gen: torch.Generator) -> torch.Tensor:
    """``(n, m)`` labels with -1 padding (at least one label per row) and repeated labels."""
    labels = torch.randint(0, num_fine, (n, m), generator=gen)
    pad = torch.rand(n, m, generator=gen) < 0.4
    pad[:, 0] = False
    labels = labels.masked_fill(pad, -1)
    perm = torch.argsort(torch.rand(n, m, generator=gen), dim=1)
    return labels.gather(1, perm)


def naive_relevance(query_labels, ref_labels, table) -> torch.Tensor:
    """Algorithm 1 literally, with LCA = first column at which the two ancestor rows agree (L if none)."""
    rows = [[int(v) for v in row] for row in table] if table is not None else None
    L = 1 if rows is None else len(rows[0])

    def lca(a: int, b: int) -> int:
        anc_a = [a] if rows is None else rows[a]
        anc_b = [b] if rows is None else rows[b]
        for c in range(L):
            if anc_a[c] == anc_b[c]:
                return c
        return L

    out = torch.zeros(len(query_labels), len(ref_labels), dtype=torch.float64)
    for qi, q in enumerate(query_labels.tolist()):
        q_set = sorted({y for y in q if y >= 0})
        for ki, k in enumerate(ref_labels.tolist()):
            k_set = {y for y in k if y >= 0}
            total = sum(L - min(lca(y_q, y_k) for y_k in k_set) for y_q in q_set)
            out[qi, ki] = total / (len(q_set) * L)
    return out


@pytest.mark.parametrize("num_levels", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_naive_loop_on_random_hierarchies(num_levels, seed):
    gen = torch.Generator().manual_seed(seed)
    table = random_table(12, num_levels, gen)
    q = random_multilabels(9, 4, 12, gen)
    r = random_multilabels(15, 3, 12, gen)
    got = multilabel_relevance(q, r, table, dtype=torch.float64)
    assert torch.equal(got, naive_relevance(q, r, table))
    assert torch.equal(multilabel_relevance(q, r, Hierarchy(table), dtype=torch.float64), got)
    assert bool(((got >= 0) & (got <= 1)).all())


def test_flat_labels_fraction_of_shared_labels():
    q = torch.tensor([[0, 1, -1], [2, 2, 3], [5, -1, -1]])
    r = torch.tensor([[1, 7], [0, 1], [3, -1], [4, 6]])
    got = multilabel_relevance(q, r, dtype=torch.float64)
    expected = torch.tensor([[1 / 2, 1.0, 0.0, 0.0], [0.0, 0.0, 1 / 2, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.equal(got, expected)  # the repeated label 2 counts once: query 1 is the set {2, 3}
    assert torch.equal(got, naive_relevance(q, r, None))
    one_level = torch.arange(8)[:, None]
    assert torch.equal(multilabel_relevance(q, r, one_level, dtype=torch.float64), got)


def test_hand_computed_hierarchical_case():
    # query {0, 3}; L = 3
    q = torch.tensor([[0, 3]])
    r = torch.tensor([[0, 3], [1, -1], [2, 4], [2, -1], [3, 1]])
    got = multilabel_relevance(q, r, TABLE, dtype=torch.float64)
    # [0,3]: 3 + 3; [1]: 0->1 LCA 1 (l*=2), 3->1 LCA 3 (0); [2,4]: 0->2 LCA 2 (1), 3->4 LCA 1 (2);
    # [2]: 0->2 (1), 3->2 (0); [3,1]: 0->1 (2), 3->3 (3)
    expected = torch.tensor([[6, 2, 3, 1, 5]], dtype=torch.float64) / 6
    assert torch.equal(got, expected)


def test_one_label_per_item_is_level_over_num_levels():
    gen = torch.Generator().manual_seed(3)
    table = random_table(10, 3, gen)
    q = torch.randint(0, 10, (7,), generator=gen)
    r = torch.randint(0, 10, (11,), generator=gen)
    levels = level_matrix(table[q], table[r])
    got = multilabel_relevance(q, r, table, dtype=torch.float64)
    assert torch.equal(got, levels.double() / 3)
    assert torch.equal(multilabel_relevance(q[:, None], r[:, None], table, dtype=torch.float64), got)


@pytest.mark.parametrize("block_elements", [1, 7, 50, 10**9])
def test_blocks_do_not_change_the_result(block_elements):
    gen = torch.Generator().manual_seed(4)
    table = random_table(9, 3, gen)
    q = random_multilabels(13, 3, 9, gen)
    r = random_multilabels(17, 4, 9, gen)
    ref = multilabel_relevance(q, r, table)
    assert ref.dtype == torch.float32 and ref.shape == (13, 17)
    assert torch.equal(multilabel_relevance(q, r, table, block_elements=block_elements), ref)
    assert torch.equal(ref, multilabel_relevance(q, r, table, dtype=torch.float64).float())


def test_equal_fractions_are_bit_identical():
    # 1/2 (one of two labels, L = 1) and 2/4 (two of four labels) must tie exactly
    q = torch.tensor([[0, 1, -1, -1], [0, 1, 2, 3]])
    r = torch.tensor([[0, -1], [0, 1]])
    got = multilabel_relevance(q, r)
    assert got[0, 0] == got[1, 1] == 0.5


def test_empty_inputs():
    q = torch.zeros(0, 2, dtype=torch.long)
    r = torch.tensor([[0], [1]])
    assert multilabel_relevance(q, r).shape == (0, 2)
    assert multilabel_relevance(r, q).shape == (2, 0)


def test_device(device):
    gen = torch.Generator().manual_seed(5)
    table = random_table(8, 2, gen)
    q = random_multilabels(5, 3, 8, gen)
    r = random_multilabels(6, 2, 8, gen)
    got = multilabel_relevance(q.to(device), r.to(device), table.to(device), dtype=torch.float64)
    assert got.device.type == device.type
    assert torch.equal(got.cpu(), naive_relevance(q, r, table))


def test_validation():
    r = torch.tensor([[0, 1]])
    with pytest.raises(TypeError, match="query_labels"):
        multilabel_relevance([[0]], r)
    with pytest.raises(TypeError, match="ref_labels.*integer dtype"):
        multilabel_relevance(r, r.float())
    with pytest.raises(TypeError, match="query_labels.*integer dtype"):
        multilabel_relevance(r.bool(), r)
    with pytest.raises(ValueError, match="query_labels must have shape"):
        multilabel_relevance(torch.zeros(2, 2, 2, dtype=torch.long), r)
    with pytest.raises(ValueError, match="ref_labels must have shape"):
        multilabel_relevance(r, torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="query_labels.*-1 for padding.*-2"):
        multilabel_relevance(torch.tensor([[0, -2]]), r)
    with pytest.raises(ValueError, match="ref_labels row 1 has no label"):
        multilabel_relevance(r, torch.tensor([[0, 1], [-1, -1]]))
    with pytest.raises(ValueError, match="ref_labels contains fine label 9.*num_fine=5"):
        multilabel_relevance(r, torch.tensor([[9]]), TABLE)
    unused = TABLE.clone()
    unused[1] = -1
    with pytest.raises(ValueError, match="query_labels contains fine label 1"):
        multilabel_relevance(r, r, unused)
    with pytest.raises(TypeError, match="hierarchy"):
        multilabel_relevance(r, r, [[0, 0], [1, 0]])
    with pytest.raises(ValueError, match="hierarchy is not a tree"):
        multilabel_relevance(r, r, torch.tensor([[0, 0, 0], [1, 0, 1]]))
    with pytest.raises(TypeError, match="dtype"):
        multilabel_relevance(r, r, dtype=torch.long)
    with pytest.raises(ValueError, match="block_elements"):
        multilabel_relevance(r, r, block_elements=0)
