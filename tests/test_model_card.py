"""The retrieval model card as the Hub and a reader meet it: a real title, Hub metadata (license, base model,
datasets, ``model-index`` with the measured numbers), the run's hyper-parameters, intended use and limitations, each
number once, and a usage snippet that runs as written; one card writer for the recipe and the Python path (a loaded
folder saved or pushed again keeps its whole card), names from user data escaped, no local path, the classes listed,
the OOD guard rendered, one unit, defined metric names, no empty rows or columns, citations in BibTeX."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from _hub_http import fake_hub_http
from huggingface_hub import ModelCard
from PIL import Image

from pml_suprank.models import RetrievalModel
from pml_suprank.ood.guard import weights_sha256

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
    assert "## Intended use and limitations" in text
    assert "**Warning — short run:** only 20 optimizer steps" in text  # the console's warning, same rule
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
    from pml_suprank.hub._card_sections import _base_model

    assert _base_model({"model_args": {"backbone": "resnet50", "pretrained": True}}) == "timm/resnet50.a1_in1k"
    assert _base_model({"model_args": {"backbone": "hf-hub:org/net", "pretrained": True}}) == "org/net"
    assert _base_model({"model_args": {"backbone": "resnet50", "pretrained": False}}) is None


# ------------------------------------------------------------------------------------------------ the whole card
GUARD = {
    "threshold": 1.25,
    "tpr_target": 0.95,
    "id_tpr": 0.9412,
    "ood_sets": {"noise": {"fpr": 0.031, "auroc": 0.987}, "<b>held-out</b>": {"fpr": 0.25, "auroc": 0.8}},
}


def _store_guard(folder):
    """A real OOD guard of the folder's weights (a Mahalanobis detector on random features, the values of ``GUARD``),
    stored as ``fit_heat --model`` stores it, then the card rewritten from the folder's files."""
    from pml_suprank import ood
    from pml_suprank.hub.card import write_card
    from pml_suprank.ood.guard import OODGuard, weights_sha256

    gen = torch.Generator().manual_seed(0)
    detector = ood.Mahalanobis().fit(features=torch.randn(40, 8, generator=gen), labels=torch.arange(40) % 2)
    OODGuard(detector, feature_kind="pooled", model_sha256=weights_sha256(folder), **GUARD).save(folder)
    write_card(folder)
    return folder


def _run_folder(root, *, dataset, label_names, class_counts, guard=True, hub_datasets=None):
    """A final folder as the recipe writes it: weights, config with the run's card metadata, metrics, summary,
    history, a plot and (optionally) an OOD guard."""
    torch.manual_seed(0)
    model = RetrievalModel("test_resnet", embedding_size=8, image_size=32).eval()
    model.hub_metadata = {
        **TRAINING,
        "dataset": dataset,
        "label_names": label_names,
        "data_summary": {
            "train": {
                "images": 2 * sum(class_counts.values()),
                "classes": len(class_counts),
                "class_counts": {f"train {k}": 2 * v for k, v in class_counts.items()},
            },
            "test": {"images": sum(class_counts.values()), "classes": len(class_counts), "class_counts": class_counts},
        },  # fmt: skip
        "compute": {
            "device": "cpu",
            "device_name": "2 CPU cores (x86_64)",
            "num_processes": 1,
            "mixed_precision": "no",
            "torch": torch.__version__,
            "pml_suprank": "0",
        },  # fmt: skip
        "schedule": {"steps_per_epoch": 9, "total_steps": 20},
        "card_hub": {"datasets": hub_datasets} if hub_datasets else {},
    }
    folder = root / "final"
    folder.mkdir(parents=True)
    (folder / "training_summary.json").write_text(json.dumps({"train_time_s": 12.5, "steps": 20}))
    (folder / "history.json").write_text(json.dumps([{"step": 20, "epoch": 2, "loss": 1.0, "lr_backbone": 0.0}]))
    Image.new("RGB", (20, 10), (0, 0, 255)).save(folder / "training_curves.png")
    saved = model.save_pretrained(folder, metrics={**METRICS, "sum_w_ap": 0.33, "true_recall_at_10": 0.2})
    return _store_guard(saved) if guard else saved


def _sections(text):
    return re.findall(r"^## (.+)$", text, flags=re.M)


def test_a_loaded_folder_saved_or_pushed_again_keeps_the_whole_card(tmp_path):
    final = _run_folder(tmp_path / "run", dataset="synthetic", label_names=["fine_label", "coarse_label"],
                        class_counts={"circle/disc/red": 8, "star/star5/cyan": 8})  # fmt: skip
    original = (final / "README.md").read_text()
    assert "## Out-of-distribution guard" in original and "## Plots" in original
    again = RetrievalModel.from_pretrained(final).save_pretrained(tmp_path / "again")
    card = (again / "README.md").read_text()
    assert card == original.replace("./final", "./again")  # one writer: the same card from the same files
    for name in ("metrics.json", "training_summary.json", "history.json", "training_curves.png"):
        assert (again / name).read_bytes() == (final / name).read_bytes()
    kept, old = (json.loads((f / "ood" / "guard.json").read_text()) for f in (again, final))
    assert kept.pop("model_sha256") == weights_sha256(again)  # the guard re-bound to the file it was saved with
    old.pop("model_sha256")
    assert kept == old
    assert ModelCard.load(again / "README.md").data.to_dict()["model-index"]
    # push_to_hub of the loaded folder uploads the same card (huggingface_hub's upload, the HTTP answered locally)
    with fake_hub_http(remote=tmp_path / "remote"):
        RetrievalModel.from_pretrained(final).push_to_hub("org/name")
    pushed = (tmp_path / "remote" / "org" / "name" / "README.md").read_text()
    assert _sections(pushed) == _sections(original) and "org/name" in pushed
    assert (tmp_path / "remote" / "org" / "name" / "ood" / "guard.json").is_file()
    # changed weights: the old metrics, plots and guard describe other weights, so they are not carried
    changed = RetrievalModel.from_pretrained(final)
    with torch.no_grad():
        next(changed.parameters()).add_(1.0)
    other = changed.save_pretrained(tmp_path / "changed")
    assert not (other / "ood").exists() and not (other / "metrics.json").exists()
    assert "## Results" not in (other / "README.md").read_text()


def test_card_files_are_carried_only_for_exactly_the_saved_weights(tmp_path):
    import safetensors.torch

    from pml_suprank.hub.card import carried_files

    tied = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    tied[1].weight = tied[0].weight
    source = tmp_path / "src"
    source.mkdir()
    (source / "metrics.json").write_text(json.dumps(METRICS))
    safetensors.torch.save_model(tied, str(source / "model.safetensors"))  # the tied weight saved once
    assert carried_files(source, tmp_path / "same", tied) == [("metrics.json", source / "metrics.json")]
    state = {k: v.clone() for k, v in tied.state_dict().items()}
    extra = {**state, "extra": torch.zeros(1)}  # one tensor more than the file holds
    fewer = {k: v for k, v in state.items() if k != "1.bias"}  # one tensor less
    changed = {**state, "1.bias": state["1.bias"] + 1}
    for weights in (extra, fewer, changed):
        assert carried_files(source, tmp_path / "other", weights) == []


def test_names_from_user_data_are_escaped_and_no_local_path_is_shown(tmp_path):
    columns = ["<script>alert(1)</script>", "$\\undefinedmacro$ | x"]
    final = _run_folder(tmp_path / "run", dataset="../data/nested", label_names=columns,
                        class_counts={"<img src=x onerror=alert(1)>": 4, "cat": 3})  # fmt: skip
    text = (final / "README.md").read_text()
    assert "<script>" not in text and "<img" not in text and "&lt;script&gt;" in text
    assert "undefinedmacro$ \\| x" in text  # a "|" in a name does not break a table
    assert "../" not in text and str(tmp_path) not in text
    data = ModelCard.load(final / "README.md").data.to_dict()
    assert "datasets" not in data  # a local folder is no Hub dataset
    dataset = data["model-index"][0]["results"][0]["dataset"]
    assert " " in dataset["type"] and "nested" in dataset["type"]  # a description, never a Hub id
    training_data = text.split("## Training data", 1)[1].split("\n## ", 1)[0]
    assert "nested (a local dataset)" in training_data and "cat (3)" in training_data


def test_synthetic_data_links_no_hub_dataset_and_a_hub_id_does(tmp_path):
    final = _run_folder(tmp_path / "a", dataset="synthetic", label_names=["fine", "coarse"], class_counts={"x": 2},
                        guard=False)  # fmt: skip
    data = ModelCard.load(final / "README.md").data.to_dict()
    assert "datasets" not in data and " " in data["model-index"][0]["results"][0]["dataset"]["type"]
    assert "## Out-of-distribution guard" not in (final / "README.md").read_text()
    final = _run_folder(tmp_path / "b", dataset="uoft-cs/cifar100", label_names=["fine", "coarse"],
                        class_counts={"x": 2}, guard=False)  # fmt: skip
    data = ModelCard.load(final / "README.md").data.to_dict()
    assert data["datasets"] == ["uoft-cs/cifar100"]
    assert data["model-index"][0]["results"][0]["dataset"]["type"] == "uoft-cs/cifar100"
    assert "(https://huggingface.co/datasets/uoft-cs/cifar100)" in (final / "README.md").read_text()


def test_classes_are_listed_up_to_the_limit_then_counted(tmp_path):
    from pml_suprank.hub._card_sections import MAX_CLASSES_LISTED

    counts = {f"class{i:03d}": 3 for i in range(MAX_CLASSES_LISTED + 7)}
    final = _run_folder(tmp_path / "run", dataset="synthetic", label_names=["fine"], class_counts=counts)
    row = next(line for line in (final / "README.md").read_text().splitlines() if line.startswith("| test |"))
    assert f"class{MAX_CLASSES_LISTED - 1:03d} (3)" in row and f"class{MAX_CLASSES_LISTED:03d}" not in row
    assert row.endswith("… and 7 more classes |")


def test_guard_section_renders_the_stored_guard(tmp_path):
    final = _run_folder(tmp_path / "run", dataset="synthetic", label_names=["fine"], class_counts={"a": 2})
    guard = (final / "README.md").read_text().split("## Out-of-distribution guard", 1)[1].split("\n## ", 1)[0]
    assert "Mahalanobis detector on pooled features" in guard and "SHA-256 is in `ood/guard.json`" in guard
    assert "| threshold | 1.25 |" in guard and "score > threshold" in guard
    assert "| target ID true-positive rate (images kept) | 95.00 |" in guard
    assert "| measured ID true-positive rate (held-out ID images) | 94.12 |" in guard
    assert "| noise | 3.10 | 98.70 |" in guard and "&lt;b&gt;held-out&lt;/b&gt;" in guard


def test_one_unit_no_empty_rows_or_columns_defined_names_compute_and_citation(tmp_path):
    final = _run_folder(tmp_path / "run", dataset="synthetic", label_names=["fine", "coarse"], class_counts={"a": 2})
    text = (final / "README.md").read_text()
    assert "All metrics on this card are percentages" in text
    assert "value: 45.67" in text and "| H-AP | 45.67 |" in text  # the model-index and the table alike
    tables = [block for block in re.split(r"\n\s*\n", text) if block.startswith("|")]
    assert tables
    for block in tables:
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()]
        header, body = rows[0], rows[2:]
        assert all(header), f"empty header cell in {block!r}"
        for j in range(len(header)):
            assert not all(r[j] == "–" for r in body), f"column {header[j]!r} is all '–'"
    assert "- **ΣwAP**:" in text and "- **true recall@10**: positives in the top 10 / min(#positives, 10)" in text
    for setting in ("| lr_backbone |", "| max_train_steps |", "| optimizer steps done | 20 |"):
        assert setting in text
    compute = text.split("## Compute", 1)[1].split("\n## ", 1)[0]
    assert "| device | cpu (2 CPU cores (x86_64)) |" in compute and "| training time | 12 s |" in compute
    citation = text.split("## Citation", 1)[1]
    assert "@inproceedings{ramzi2022hierarchical" in citation and "@misc{ramzi2023optimization" in citation


def test_a_relative_local_folder_stays_local_when_the_card_is_written_elsewhere(tmp_path, monkeypatch):
    from pml_suprank.hub.card import run_card_metadata

    (tmp_path / "data" / "photos").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    meta = run_card_metadata(object(), None, "data/photos")  # where the folder exists (the training run)
    assert meta["data_summary"]["kind"] == "local"
    monkeypatch.chdir(tmp_path.parent)  # elsewhere, "data/photos" looks like a Hub id "org/name"
    final = _run_folder(tmp_path / "run", dataset="data/photos", label_names=["fine"], class_counts={"a": 2})
    config = json.loads((final / "config.json").read_text())
    config["training"]["data_summary"]["kind"] = "local"
    from pml_suprank.hub.card import generate_model_card

    text = generate_model_card(config, metrics={"ap": 0.5})
    assert "datasets:" not in text and "huggingface.co/datasets" not in text and "photos (a local dataset)" in text
    config["training"]["data_summary"].pop("kind")
    assert "huggingface.co/datasets/data/photos" in generate_model_card(config, metrics={"ap": 0.5})


def test_files_reached_through_a_linked_folder_are_not_carried(tmp_path):
    """A model folder whose ``ood/`` or ``plots/`` is a link to another folder: a re-save (and so a push) copies none
    of that folder's files, only the plain files inside the model folder."""
    from pml_suprank.hub.card import carried_files

    model = RetrievalModel("resnet18", embedding_size=8, image_size=32, pretrained=False)
    source = model.save_pretrained(tmp_path / "src", model_card=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "id_rsa").write_text("private")
    (outside / "shot.png").write_bytes(b"\x89PNG")
    (source / "ood").symlink_to(outside, target_is_directory=True)
    (source / "plots").symlink_to(outside, target_is_directory=True)
    (source / "metrics.json").write_text(json.dumps(METRICS))
    assert carried_files(source, tmp_path / "again", model) == [("metrics.json", source / "metrics.json")]
    again = RetrievalModel.from_pretrained(source).save_pretrained(tmp_path / "again")
    assert not (again / "ood").exists() and not (again / "plots").exists()
    assert json.loads((again / "metrics.json").read_text()) == METRICS  # the plain file inside is still carried
