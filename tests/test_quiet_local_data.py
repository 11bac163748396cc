"""A local folder is read without the ``datasets`` library's progress bars ("Downloading data: N files",
"Generating train split"): nothing is downloaded, and a bar saying so looks like network use offline. The bars of
the caller's own setting are left as they were."""

from __future__ import annotations

import pytest
from PIL import Image

datasets = pytest.importorskip("datasets")

from pml_suprank.data.hf_sources import load_splits  # noqa: E402


def test_a_local_image_folder_loads_without_progress_bars(tmp_path, capfd):
    for c in ("mug", "teapot"):
        (tmp_path / "photos" / c).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(tmp_path / "photos" / c / f"{i}.png")
    datasets.enable_progress_bars()
    capfd.readouterr()
    splits = load_splits(str(tmp_path / "photos"), data_files=None, cache_dir=str(tmp_path / "cache"), revision=None,
                         token=None)  # fmt: skip
    out, err = capfd.readouterr()
    assert splits["train"].num_rows == 6
    assert "Downloading" not in out + err and "Generating" not in out + err and "examples/s" not in err
    assert datasets.is_progress_bar_enabled(), "the caller's setting is restored"
