"""RetrievalIndex: equal to a brute-force top-k with the lower-index tie rule (torch backend, chunked, after add, after
a save/load round trip), faiss flat equal without ties, approximate backends sane, errors naming the argument."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pml_suprank.search import RetrievalIndex
from pml_suprank.search.topk import exact_topk, merge_topk, topk_lowest_index


def brute_force(queries, gallery, k):
    """Reference: full score matrix, one stable sort per row on decreasing score (ties keep increasing index)."""
    scores = queries.double() @ gallery.double().T
    values, order = torch.sort(scores, dim=1, descending=True, stable=True)
    return values[:, :k], order[:, :k]


def tied_data(n, d, seed, dtype=torch.float32):
    """Entries in {-1, 0, 1}: exact scores with many ties."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1, 2, (n, d), generator=g).to(dtype)


def normal_data(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, d, generator=g), dim=1)


def test_topk_lowest_index_by_hand():
    scores = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0, 5.0, 5.0]])
    values, cols = topk_lowest_index(scores, 2)
    assert cols.tolist() == [[1, 2], [0, 1]] and values.tolist() == [[3.0, 3.0], [5.0, 5.0]]
    values, cols = topk_lowest_index(scores, 4)
    assert cols.tolist() == [[1, 2, 4, 3], [0, 1, 2, 3]]
    v, i = merge_topk(torch.tensor([[2.0, 1.0, 2.0, 3.0]]), torch.tensor([[7, 1, 4, 9]]), 3)
    assert i.tolist() == [[9, 4, 7]] and v.tolist() == [[3.0, 2.0, 2.0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block_elements", [7, 64, 2**24])
@pytest.mark.parametrize("k", [1, 5, 40])
def test_torch_backend_equals_brute_force_with_ties(dtype, block_elements, k):
    gallery, queries = tied_data(53, 4, 0, dtype), tied_data(11, 4, 1, dtype)
    index = RetrievalIndex(gallery, block_elements=block_elements)
    scores, indices = index.search(queries, k)
    ref_scores, ref_indices = brute_force(queries, gallery, k)
    assert indices.dtype == torch.long and scores.dtype == dtype and scores.shape == (11, k)
    assert torch.equal(indices, ref_indices)
    torch.testing.assert_close(scores.double(), ref_scores, rtol=0, atol=0)


def test_exact_topk_matches_brute_force_on_normal_data():
    gallery, queries = normal_data(500, 16, 2), normal_data(33, 16, 3)
    scores, indices = exact_topk(queries, gallery, 10, block_elements=1000)
    ref_scores, ref_indices = brute_force(queries, gallery, 10)
    assert torch.equal(indices, ref_indices)
    torch.testing.assert_close(scores.double(), ref_scores, rtol=1e-6, atol=1e-6)


def test_add_equals_brute_force_on_the_concatenation():
    a, b, queries = tied_data(20, 3, 4), tied_data(31, 3, 5), tied_data(9, 3, 6)
    la, lb = torch.arange(20) % 3, torch.arange(31) % 3
    index = RetrievalIndex(a, labels=la, ids=[f"a{i}" for i in range(20)], block_elements=50)
    assert index.add(b, labels=lb, ids=[f"b{i}" for i in range(31)]) is index
    assert len(index) == 51 and index.ids[20] == "b0" and torch.equal(index.labels, torch.cat([la, lb]))
    _, indices = index.search(queries, 12)
    assert torch.equal(indices, brute_force(queries, torch.cat([a, b]), 12)[1])


@pytest.mark.parametrize("backend", ["torch", "faiss", "faiss-ivf"])
def test_save_load_round_trip(tmp_path, backend):
    pytest.importorskip("safetensors")
    if backend != "torch":
        pytest.importorskip("faiss")
    gallery, queries = normal_data(300, 8, 7), normal_data(10, 8, 8)
    labels = torch.stack([torch.arange(300) % 6, torch.arange(300) % 2], 1)
    kwargs = {"nlist": 8, "nprobe": 2} if backend == "faiss-ivf" else {}
    index = RetrievalIndex(gallery[:200], labels=labels[:200], ids=list(range(200)), backend=backend, **kwargs)
    index.add(gallery[200:], labels=labels[200:], ids=list(range(200, 300)))
    before = index.search(queries, 7)
    index.save(tmp_path / "idx")
    loaded = RetrievalIndex.load(tmp_path / "idx")
    assert loaded.backend == backend and loaded.options == index.options and loaded.ids == list(range(300))
    assert torch.equal(loaded.labels, labels) and torch.equal(loaded.embeddings, gallery)
    after = loaded.search(queries, 7)
    assert torch.equal(after[1], before[1]) and torch.equal(after[0], before[0])
    if backend == "faiss-ivf":
        assert loaded.options["train_size"] == 200  # trained on the same leading rows as before the add


def test_faiss_flat_equals_brute_force_without_ties():
    pytest.importorskip("faiss")
    gallery, queries = normal_data(400, 12, 9), normal_data(20, 12, 10)
    scores, indices = RetrievalIndex(gallery, backend="faiss").search(queries, 10)
    ref_scores, ref_indices = brute_force(queries, gallery, 10)
    assert torch.equal(indices, ref_indices)
    torch.testing.assert_close(scores.double(), ref_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("backend", "kwargs"),
    [
        ("faiss-ivf", {"nlist": 16, "nprobe": 16}),
        ("faiss-hnsw", {"hnsw_m": 16, "ef_construction": 80, "ef_search": 80}),
    ],
)
def test_approximate_backends_find_the_exact_neighbours_on_easy_settings(backend, kwargs):
    pytest.importorskip("faiss")
    gallery, queries = normal_data(600, 8, 11), normal_data(30, 8, 12)
    index = RetrievalIndex(gallery, backend=backend, **kwargs)
    assert index.options == {**index.options, **kwargs}
    _, indices = index.search(queries, 10)
    ref = brute_force(queries, gallery, 10)[1]
    recall = sum(len(set(a) & set(b)) for a, b in zip(indices.tolist(), ref.tolist())) / ref.numel()
    assert recall >= 0.95  # IVF with nprobe == nlist is exhaustive; HNSW with a wide beam on 600 items


def test_search_and_construction_errors():
    gallery = normal_data(10, 4, 13)
    index = RetrievalIndex(gallery, labels=torch.arange(10))
    with pytest.raises(ValueError, match=r"queries must have width D=4"):
        index.search(torch.zeros(2, 5), 1)
    with pytest.raises(TypeError, match="distributed must be a bool"):  # checked without a process group too
        index.search(torch.zeros(2, 4), 1, distributed="yes")
    bad = torch.zeros(2, 4)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="queries contains NaN or inf"):
        index.search(bad, 1)
    with pytest.raises(ValueError, match=r"k must be <= the number of gallery items \(10\); got k=11"):
        index.search(gallery, 11)
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        index.search(gallery, 0)
    with pytest.raises(TypeError, match="queries must be a floating-point"):
        index.search(torch.zeros(2, 4, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="backend must be one of"):
        RetrievalIndex(gallery, backend="annoy")
    with pytest.raises(ValueError, match="nlist applies to backend='faiss-ivf'"):
        RetrievalIndex(gallery, nlist=4)
    with pytest.raises(TypeError, match=r"unknown option 'nlists'; options are \['ef_construction'"):
        RetrievalIndex(gallery, nlists=4)
    with pytest.raises(ValueError, match="embeddings contains NaN or inf"):
        RetrievalIndex(gallery.masked_fill(gallery > 0.5, float("inf")))
    with pytest.raises(ValueError, match="labels must be given exactly when the index has them"):
        index.add(gallery)
    with pytest.raises(ValueError, match="ids must be given exactly when the index has them"):
        index.add(gallery, labels=torch.arange(10), ids=["x"] * 10)
    with pytest.raises(ValueError, match=r"labels must have the index's label shape"):
        index.add(gallery, labels=torch.zeros(10, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="embeddings must have width D=4"):
        index.add(torch.zeros(3, 2), labels=torch.arange(3))
    with pytest.raises(ValueError, match="ids must have one id per embedding"):
        RetrievalIndex(gallery, ids=["a"])
    for bad in (None, 1.5, True):  # a None id was taken for "no bad id found" and saved as JSON null
        with pytest.raises(TypeError, match=rf"ids must contain str or int ids; got \w+ {bad} at position 3"):
            RetrievalIndex(gallery, ids=["a", "b", 2, bad, *range(6)])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda' but CUDA is not available"):
            RetrievalIndex(gallery, device="cuda")


def test_ivf_needs_enough_training_rows():
    pytest.importorskip("faiss")
    with pytest.raises(ValueError, match=r"needs at least nlist=32 embeddings"):
        RetrievalIndex(normal_data(10, 4, 14), backend="faiss-ivf", nlist=32, nprobe=1)
    with pytest.raises(ValueError, match="nprobe must be <= nlist=4"):
        RetrievalIndex(normal_data(10, 4, 14), backend="faiss-ivf", nlist=4, nprobe=5)


def test_torch_backend_on_each_device(device):
    gallery, queries = tied_data(40, 3, 15), tied_data(6, 3, 16)
    index = RetrievalIndex(gallery, device=device, block_elements=30)
    scores, indices = index.search(queries, 9)
    assert indices.device.type == device.type
    assert torch.equal(indices.cpu(), brute_force(queries, gallery, 9)[1])


def test_set_search_options_changes_the_approximate_search_only():
    pytest.importorskip("faiss")
    gallery, queries = normal_data(400, 8, 17), normal_data(20, 8, 18)
    index = RetrievalIndex(gallery, backend="faiss-ivf", nlist=16, nprobe=1)
    narrow = index.search(queries, 10)[1]
    assert index.set_search_options(nprobe=16) is index and index.options["nprobe"] == 16
    assert torch.equal(index.search(queries, 10)[1], brute_force(queries, gallery, 10)[1])  # exhaustive now
    assert not torch.equal(narrow, index.search(queries, 10)[1])
    with pytest.raises(ValueError, match="ef_search applies to backend='faiss-hnsw'"):
        index.set_search_options(ef_search=10)
    with pytest.raises(ValueError, match="nprobe must be <= nlist=16"):
        index.set_search_options(nprobe=17)
    hnsw = RetrievalIndex(gallery, backend="faiss-hnsw", hnsw_m=8, ef_search=16)
    hnsw.set_search_options(ef_search=200)
    assert hnsw.options["ef_search"] == 200 and hnsw.search(queries, 10)[1].shape == (20, 10)


def test_faiss_results_order_ties_by_index_and_match_the_exact_scores():
    pytest.importorskip("faiss")
    gallery, queries = tied_data(60, 4, 19), tied_data(12, 4, 20)
    scores, indices = RetrievalIndex(gallery, backend="faiss").search(queries, 8)
    for s, i in zip(scores.tolist(), indices.tolist()):
        keys = [(-a, b) for a, b in zip(s, i)]
        assert keys == sorted(keys)  # decreasing score, then increasing index
    torch.testing.assert_close(scores.double(), brute_force(queries, gallery, 8)[0], rtol=0, atol=0)


def test_more_queries_than_one_block():
    gallery, queries = tied_data(50, 3, 21), tied_data(1100, 3, 22)  # 1100 queries: two query blocks of <= 1024
    scores, indices = exact_topk(queries, gallery, 6, block_elements=100)
    ref_scores, ref_indices = brute_force(queries, gallery, 6)
    assert torch.equal(indices, ref_indices) and torch.equal(scores.double(), ref_scores)


@pytest.mark.parametrize(
    ("backend", "kwargs", "message"),
    [
        ("faiss-ivf", {"nlist": 10**12}, "nlist must be <= 2147483647; got 1000000000000"),
        ("faiss-ivf", {"nlist": 10**6}, r"needs at least nlist=1000000 embeddings .* got 20 \(lower nlist"),
        ("faiss-ivf", {"nlist": 4, "train_size": 3}, r"needs at least nlist=4 embeddings .* got 3"),
        ("faiss-ivf", {"nprobe": 2**31}, "nprobe must be <= 2147483647"),
        ("faiss-hnsw", {"hnsw_m": 10**7}, "hnsw_m must be <= 512; got 10000000"),
        ("faiss-hnsw", {"hnsw_m": 2**40}, "hnsw_m must be <= 512"),
        ("faiss-hnsw", {"ef_search": 2**31}, "ef_search must be <= 65536; got 2147483648"),
        ("faiss-hnsw", {"ef_construction": 10**9}, "ef_construction must be <= 65536"),
        ("torch", {"block_elements": 2**40}, "block_elements must be <= 2147483647"),
    ],
)
def test_options_are_bounded_before_anything_is_allocated(backend, kwargs, message):
    # no faiss needed: the options are refused before faiss is imported or any structure is built
    with pytest.raises(ValueError, match=message):
        RetrievalIndex(normal_data(20, 4, 30), backend=backend, **kwargs)


def test_search_options_are_bounded():
    pytest.importorskip("faiss")
    index = RetrievalIndex(normal_data(40, 4, 31), backend="faiss-hnsw", hnsw_m=4)
    with pytest.raises(ValueError, match="ef_search must be <= 65536; got 2147483648"):
        index.set_search_options(ef_search=2**31)
    assert index.options["ef_search"] == 64  # unchanged by the refused call
    index.set_search_options(ef_search=65536)
    assert index.search(normal_data(3, 4, 32), 5)[1].shape == (3, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scores_that_would_overflow_are_refused(dtype):
    top = torch.finfo(dtype).max
    gallery = torch.cat([torch.eye(6, dtype=dtype), torch.ones(1, 6, dtype=dtype)])  # last row: score = sum(q)
    queries = torch.tensor([[0.75 * top, 0.75 * top, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=dtype)
    with pytest.raises(ValueError, match=r"queries and the gallery are too large for float(32|64) scores"):
        RetrievalIndex(gallery).search(queries, 3)  # the true best score 1.5·max would come back as inf
    with pytest.raises(ValueError, match="overflow to inf"):  # a large gallery row, unit queries
        RetrievalIndex(queries.clone()).search(gallery, 2)
    # large but fitting: finite scores, the exact ranking
    fit = torch.tensor([[top / 16, top / 32, 0, 0, 0, 0]], dtype=dtype)
    scores, indices = RetrievalIndex(gallery).search(fit, 3)
    assert bool(torch.isfinite(scores).all()) and indices.tolist() == [[6, 0, 1]]
    assert scores[0].tolist() == [(fit[0, 0] + fit[0, 1]).item(), fit[0, 0].item(), fit[0, 1].item()]


def test_overflow_check_sees_rows_added_later():
    index = RetrievalIndex(torch.eye(4))
    index.search(torch.full((1, 4), 1e30), 2)  # 2e30 * 1: fits
    index.add(torch.full((1, 4), 1e30))
    with pytest.raises(ValueError, match="overflow to inf"):
        index.search(torch.full((1, 4), 1e30), 2)


@pytest.mark.parametrize("scale", [1e-25, 1e-40, 1e-44])
@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_tiny_embeddings_are_ranked_exactly(backend, scale):
    # scores of 1e-25 x 1e-25 entries underflow to 0 in float32: every item tied, ranked by index
    if backend == "faiss":
        pytest.importorskip("faiss")
    gallery, queries = normal_data(300, 16, 40) * scale, normal_data(6, 16, 41) * scale
    scores, indices = RetrievalIndex(gallery, backend=backend).search(queries, 8)
    ref_scores, ref_indices = brute_force(queries, gallery, 8)  # float64: exact products of the values as given
    torch.testing.assert_close(scores, ref_scores.float(), rtol=0, atol=0)  # the true scores, rounded (0 here)
    # the true score of every returned item is the exact top 8: one product (Q @ G.T, as the reference) — G @ Q.T
    # may differ from it by one ulp under another BLAS, which says nothing about the ranking
    exact = queries.double() @ gallery.double().T
    assert torch.equal(exact.gather(1, indices), ref_scores)
    if backend == "torch":  # and ties by lower index (faiss breaks ties its own way)
        assert torch.equal(indices, ref_indices)
    # one side tiny: the items found for the same queries scaled up exactly (a power of two), on the same gallery
    index, up = RetrievalIndex(gallery / scale, backend=backend), (queries.double() * 2.0**140).float()
    found, found_up = index.search(queries, 8)[1], index.search(up, 8)[1]
    true = ((gallery / scale).double() @ up.double().T).T
    assert torch.equal(true.gather(1, found), true.gather(1, found_up))
    assert backend != "torch" or torch.equal(found, found_up)
