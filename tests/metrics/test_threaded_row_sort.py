"""The CPU row sort of the ranking keys split over threads gives exactly ``torch.sort``'s values."""

import torch

from pml_suprank.metrics import ranks


def test_threaded_row_sort_matches_torch_sort(monkeypatch):
    monkeypatch.setattr(ranks, "_SORT_BAND_MIN", 64)  # bands of a few rows: every thread sorts something
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(-(2**62), 2**62, (7, 50), generator=g)
    keys[3, :10] = keys[3, 10]  # repeated keys
    expected = torch.sort(keys, dim=1).values
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            out = ranks._sort_rows(keys.clone())
            assert torch.equal(out, expected), threads
    finally:
        torch.set_num_threads(previous)


def test_row_sort_of_a_single_row_and_of_a_view():
    row = torch.tensor([[5, -3, 2**40, 0]])
    assert torch.equal(ranks._sort_rows(row.clone()), torch.tensor([[-3, 0, 5, 2**40]]))
    assert ranks._sort_rows(torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3)
    strided = torch.tensor([[3, 1], [2, 0]]).T  # not contiguous: the torch.sort fallback
    assert torch.equal(ranks._sort_rows(strided), torch.tensor([[2, 3], [0, 1]]))
