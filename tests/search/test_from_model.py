"""RetrievalModel.build_index / RetrievalModel.search on a tiny timm model: the same neighbours as embedding by hand
and searching the index, for image tensors, PIL images and image files."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("timm")

from pml_suprank.data import SyntheticShapes, build_transforms  # noqa: E402
from pml_suprank.models import RetrievalModel  # noqa: E402
from pml_suprank.search import RetrievalIndex  # noqa: E402


@pytest.fixture(scope="module")
def model_and_data():
    torch.manual_seed(0)
    model = RetrievalModel("test_resnet", embedding_size=8, image_size=16).eval()
    transform = build_transforms(model.data_config, train=False)
    return model, SyntheticShapes("test", num_per_class=2, image_size=16, transform=transform)


def test_build_index_from_a_dataset_and_a_loader(model_and_data):
    model, ds = model_and_data
    index = model.build_index(ds, batch_size=10)
    assert isinstance(index, RetrievalIndex) and model.retrieval_index is index
    assert len(index) == len(ds) and torch.equal(index.labels, ds.labels)
    with torch.no_grad():
        expected = model(torch.stack([ds[i]["image"] for i in range(len(ds))]))
    torch.testing.assert_close(index.embeddings, expected, rtol=1e-5, atol=1e-5)
    loader = torch.utils.data.DataLoader(ds, batch_size=7)
    again = model.build_index(loader, ids=[f"x{i}" for i in range(len(ds))])
    torch.testing.assert_close(again.embeddings, index.embeddings, rtol=1e-5, atol=1e-5)
    assert again.ids[3] == "x3"


def test_search_accepts_tensors_pil_images_and_paths(model_and_data, tmp_path):
    model, ds = model_and_data
    index = model.build_index(ds)
    images = torch.stack([ds[i]["image"] for i in (0, 5, 9)])
    with torch.no_grad():
        expected = index.search(model(images), 4)
    scores, indices = model.search(images, k=4)
    assert torch.equal(indices, expected[1])
    torch.testing.assert_close(scores, expected[0])
    pil = [ds.get_image(i) for i in (0, 5, 9)]
    assert torch.equal(model.search(pil, k=4)[1], expected[1])
    paths = []
    for j, img in enumerate(pil):
        paths.append(tmp_path / f"q{j}.png")
        img.save(paths[-1])
    assert torch.equal(model.search(paths, k=4)[1], expected[1])
    assert torch.equal(model.search(images[0], k=4)[1], expected[1][:1])  # one (3, H, W) image
    assert torch.equal(model.search(images, k=4, index=index)[1], expected[1])


def test_search_errors(model_and_data):
    model, ds = model_and_data
    fresh = RetrievalModel("test_resnet", embedding_size=8, image_size=16)
    with pytest.raises(TypeError, match=r"index must be a RetrievalIndex \(build one with model.build_index"):
        fresh.search(torch.zeros(1, 3, 16, 16), k=1)
    model.build_index(ds)
    with pytest.raises(TypeError, match="images must be tensors, PIL images or image paths"):
        model.search([1, 2], k=1)
    with pytest.raises(ValueError, match=r"images must be a float tensor \(B, 3, H, W\)"):
        model.search(torch.zeros(2, 3, 16, 16, dtype=torch.uint8), k=1)
    with pytest.raises(ValueError, match="k must be <= the number of gallery items"):
        model.search(torch.zeros(1, 3, 16, 16), k=len(ds) + 1)
