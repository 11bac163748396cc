"""The retrieval model card as the Hub and a reader meet it: a real title, Hub metadata (license, base model,
datasets, ``model-index`` with the measured numbers), the run's hyper-parameters, intended use and limitations, each
number once, and a usage snippet that runs as written."""

from __future__ import annotations

import os

import pytest
import torch
from huggingface_hub import ModelCard
from PIL import Image

from pml_suprank.models import RetrievalModel

pytestmark = pytest.mark.hub

METRICS = {
    "h_ap": 0.4567,
    "ap": 0.25,
    "ap_level0": 0.25,  # the same number as "ap" by definition
    "recall_at_1": 0.5,
    "precision_at_1": 0.5,
    "true_recall_at_1": 0.5,
    "map_at_1": 0.5,
    "precision_at_10": 0.3,
    "ap_level1": 0.4,
    "num_queries": 12,
}
TRAINING = {
    "loss": "HAPPIER",
    "label_names": ["fine_label", "coarse_label"],
    "dataset": "synthetic",
    "loss_kwargs": {"tau": 0.01, "rho": 100.0, "delta": None},
    "training_config": {"optimizer": "adam", "lr_backbone": 0.001, "batch_size": 64, "max_train_steps": 20},
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    model = RetrievalModel("test_resnet", embedding_size=8, image_size=32).eval()
    model.hub_metadata = TRAINING
    return model.save_pretrained(tmp_path_factory.mktemp("run") / "final", metrics=METRICS)


def test_card_front_matter_is_what_the_hub_reads(folder):
    card = ModelCard.load(folder / "README.md")
    data = card.data.to_dict()
    assert data["license"] == "mit"
    assert "base_model" not in data  # trained from scratch: no base model to name
    (index,) = data["model-index"]
    assert index["name"] == "HAPPIER retrieval model (test_resnet, synthetic)"
    results = {m["type"]: m["value"] for r in index["results"] for m in r["metrics"]}
    assert results == {"h_ap": 45.67, "ap": 25.0, "recall_at_1": 50.0}
    assert {r["dataset"]["split"] for r in index["results"]} == {"test"}


def test_card_body_title_hyper_parameters_limits_and_each_number_once(folder):
    text = ModelCard.load(folder / "README.md").text
    assert "# HAPPIER retrieval model (test_resnet, synthetic)" in text and "# final" not in text
    assert "| loss: tau | `0.01` |" in text and "| lr_backbone | `0.001` |" in text
    assert "loss: delta" not in text  # unset options are not listed
    assert "## Intended use and limitations" in text and "20 optimizer steps only" in text
    # R@1 = P@1 = true recall@1 = mAP@1 and AP = AP (fine_label): one row each
    assert text.count("| 50.00 |") == 1 and text.count("| 25.00 |") == 1
    assert "| P@10 | 30.00 |" in text and "| AP (coarse_label) | 40.00 |" in text


def test_card_usage_snippet_runs_as_written(folder, monkeypatch):
    text = ModelCard.load(folder / "README.md").text
    snippet = text.split("## Usage", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(folder.parent)
    Image.new("RGB", (40, 30), (200, 30, 30)).save("query.jpg")
    namespace: dict = {}
    exec(compile(snippet, "card-usage", "exec"), namespace)
    embedding = namespace["embedding"]
    assert embedding.shape == (1, 8)
    torch.testing.assert_close(embedding.norm(dim=1), torch.ones(1))
    assert os.path.basename(str(folder)) in snippet  # loads this folder


def test_card_names_the_pretrained_base_model():
    from pml_suprank.hub.card import _base_model

    assert _base_model({"model_args": {"backbone": "resnet50", "pretrained": True}}) == "timm/resnet50.a1_in1k"
    assert _base_model({"model_args": {"backbone": "hf-hub:org/net", "pretrained": True}}) == "org/net"
    assert _base_model({"model_args": {"backbone": "resnet50", "pretrained": False}}) is None
