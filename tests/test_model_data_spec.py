"""A model folder records its data spec (``data_spec.json``): ``evaluate`` / ``fit_heat`` given ``--model RUN/final``
and the training folder reuse the training run's data (label columns, class split, seed, evaluator options) and
``evaluate`` reproduces the run's final metrics. The recorded folder is a suggestion: a path outside the model folder
is followed only when the user names it (``--dataset`` / ``--gallery`` / ``--id_dataset``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _helpers import import_recipe

pytest.importorskip("accelerate")
pytest.importorskip("timm")
pytest.importorskip("datasets")
Image = pytest.importorskip("PIL.Image")

COLOURS = [(220, 40, 40), (40, 200, 40), (40, 40, 220), (200, 200, 40), (200, 40, 200), (40, 200, 200)]
TINY = [
    "--backbone", "test_resnet", "--image_size", "64", "--embedding_size", "16", "--eval_batch_size", "64",
    "--cpu", "--max_train_steps", "2", "--no_plots", "--with_tracking", "false", "--skip_initial_eval",
]  # fmt: skip


def _class_folders(root: Path, per_class: int = 3) -> Path:
    """Six class folders and no split: training splits the classes in two, seeded by the run (64 px: a 2 x 2 last
    feature map, so that HEAT has std-pooled features)."""
    for k, colour in enumerate(COLOURS):
        for i in range(per_class):
            rng = np.random.default_rng(100 * k + i)
            pixels = np.clip(np.array(colour)[None, None] // 4 + rng.integers(0, 200, (12, 12, 3)), 0, 255)
            path = root / f"class{k}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels.astype(np.uint8)).save(path)
    return root


@pytest.fixture
def trained(tmp_path_factory):
    import datasets

    tmp = tmp_path_factory.mktemp("run")
    old = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = str(tmp / "hf_cache")
    try:
        folder = _class_folders(tmp / "photos")
        out = tmp / "run"
        summary = import_recipe("train_roadmap").main([*TINY, "--dataset", str(folder), "--output_dir", str(out),
                                                       "--seed", "5", "--k_values", "1", "2"])  # fmt: skip
        yield out / "final", folder, summary
    finally:
        datasets.config.HF_DATASETS_CACHE = old


@pytest.mark.slow
def test_evaluate_with_the_model_and_its_folder_reproduces_the_training_runs_final_metrics(trained, tmp_path):
    final, folder, summary = trained
    spec = json.loads((final / "data_spec.json").read_text())
    assert spec["seed"] == 5 and spec["k_values"] == [1, 2] and spec["data"]["label_columns"] == ["label"]
    assert spec["data"]["dataset"] == folder.name  # a name: a model folder holds no local path
    assert spec.get("local_dataset") is True
    for file in final.rglob("*"):
        if file.is_file() and file.suffix in (".json", ".md"):
            assert str(folder.parent) not in file.read_text(), file
    with pytest.raises(SystemExit) as e:  # the recorded folder is not read until the user names it
        import_recipe("evaluate").main(["--model", str(final), "--cpu"])
    assert e.value.code == 2
    metrics = import_recipe("evaluate").main(["--model", str(final), "--dataset", str(folder), "--cpu"])
    after = summary["after"]
    assert metrics.keys() == after.keys() and "recall_at_2" in metrics
    for key, value in after.items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key
    # the same folder named by another spelling keeps the recorded class split and seed
    again = import_recipe("evaluate").main(["--model", str(final), "--dataset", str(folder / "."), "--cpu"])
    assert again == pytest.approx(metrics)


@pytest.mark.slow
def test_search_with_the_model_and_its_folder_searches_its_test_set(trained, tmp_path):
    final, folder, _ = trained
    with pytest.raises(SystemExit):  # the recorded folder is not read until the user names it
        import_recipe("search").main(["--model", str(final), "--output_dir", str(tmp_path / "s"), "--k", "2",
                                      "--num_queries", "3"])  # fmt: skip
    result = import_recipe("search").main(["--model", str(final), "--gallery", str(folder), "--output_dir",
                                           str(tmp_path / "s"), "--k", "2", "--num_queries", "3"])  # fmt: skip
    assert result["gallery"]["size"] == 9  # the 3 test classes of the seeded class split, 3 images each
    assert result["label_names"] == ["label"]


@pytest.mark.slow
def test_fit_heat_on_the_users_retrieval_model(trained, tmp_path):
    """``fit_heat --model RUN/final``: the package's retrieval model (frozen backbone, a classification head trained
    on the run's own training classes), the ID sets from its data spec (the folder confirmed by --id_dataset); the
    head is trained by default."""
    final, folder, _ = trained
    fit_heat = import_recipe("fit_heat")
    argv = ["--model", str(final), "--id_dataset", str(folder), "--ood_datasets", "noise-uniform", "--num_noise", "8",
            "--heat_epochs", "1", "--knn_k", "3", "--no_odin", "--no_plots", "--progress", "false", "--threads", "1",
            "--output_dir", str(tmp_path / "heat")]  # fmt: skip
    with pytest.warns(UserWarning, match="optimizer step"):
        results = fit_heat.main(argv)
    assert results["args"]["train_epochs"] == 5 and len(results["classifier_history"]) == 5
    assert results["classifier_test_accuracy"] is None  # open set: the test classes are not the training classes
    table = results["table"]
    assert "HEAT" in table and 0.0 <= table["HEAT"]["noise-uniform"]["auroc"] <= 1.0
    from pml_suprank import ood

    saved = ood.load_features(tmp_path / "heat" / "features.safetensors")
    assert len(saved.sets["id_train"]) == 9 and saved.weight.shape == (3, 96)  # 3 training classes, pooled width


@pytest.mark.slow
def test_a_class_folder_added_after_training_is_refused_not_silently_split(trained, tmp_path, capsys):
    """The recorded class split is checked: a class folder added later would change which classes are test classes
    (the seeded split of 7 classes is not that of 6), so ``evaluate`` refuses with the reason instead of scoring
    another test set."""
    final, folder, _ = trained
    recorded = json.loads((final / "data_spec.json").read_text())["class_split"]
    assert len(recorded["train_classes"]) + len(recorded["test_classes"]) == 6
    _class_folders(tmp_path / "extra")
    (tmp_path / "extra" / "class0").rename(folder / "class_new")
    with pytest.raises(SystemExit) as refused:
        import_recipe("evaluate").main(["--model", str(final), "--dataset", str(folder), "--cpu"])
    assert refused.value.code == 2 and "changed since the model was trained" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["dataset", "data_root"])
@pytest.mark.parametrize("value", ["a" * 300, "a" * 5000])  # one path component too long, a path too long
def test_a_recorded_value_the_file_system_cannot_look_up_is_a_value_error_naming_the_key(key, value, tmp_path):
    """A name too long to look up (``OSError: File name too long`` from the existence check) is refused naming the
    file and the key, not a raw OSError."""
    from pml_suprank.training.spec import model_data

    data = {"dataset": "synthetic", key: value}
    spec = {"version": 1, "data": data, "seed": 0, "k_values": [1], "alpha": 1.0}
    (tmp_path / "data_spec.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=rf"data_spec.json: data.{key} is 'a.*neither a dataset name nor a usable"):
        model_data(str(tmp_path))
