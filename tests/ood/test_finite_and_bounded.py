"""Finite by construction and bounded configs (issue 20 items 3 and 4): a loaded HEAT ``config.json`` is bounded by
one schema at every level of ``settings`` and its booleans are strictly typed; deeply nested JSON is a clear
``ValueError``; a tiny ``standardization_std`` is refused; GMM / SSD+ / ViM fits on constant features are refused as
degenerate (as Mahalanobis already was) while KNN / DICE / ReAct stay finite; HEAT refuses non-finite scores with
the reason; ``RetrievalEvaluator`` rescales tiny embeddings exactly."""

from __future__ import annotations

import json
import time

import pytest
import torch

from pml_suprank import ood
from pml_suprank.metrics import RetrievalEvaluator
from pml_suprank.models import RetrievalModel

safetensors_torch = pytest.importorskip("safetensors.torch")
D, C, N = 8, 3, 60


def _data(constant=False):
    g = torch.Generator().manual_seed(0)
    z = torch.full((N, D), 0.7) if constant else torch.randn(N, D, generator=g)
    return {"features": z, "std_features": z.abs() + 0.1, "labels": torch.arange(N) % C,
            "weight": torch.randn(C, D, generator=g), "bias": torch.randn(C, generator=g)}  # fmt: skip


def _saved_heat(folder):
    x = _data()
    heat = ood.HEAT(priors=("gmm",), preset="fast", settings={"epochs": 0})
    heat.fit(features=x["features"], labels=x["labels"]).save_pretrained(folder, model_card=False)
    return folder / "config.json"


def _edit_settings(path, edit):
    config = json.loads(path.read_text())
    edit(config["model_args"])
    path.write_text(json.dumps(config))


# -- bounded configs ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("place", "key", "value", "match"),
    [
        ("top", "n_hidden_layers", 100_000, r"settings\['n_hidden_layers'\] must be an int in \[0, 64\]"),
        ("top", "hidden_dim", 10**9, r"settings\['hidden_dim'\] must be an int in \[1, 65536\]"),
        ("prior", "n_hidden_layers", 100_000, r"settings\['gmm'\]\['n_hidden_layers'\] must be an int in \[0, 64\]"),
        ("top", "sgld_steps", 10**12, r"settings\['sgld_steps'\] must be an int"),
        ("top", "reduce_width", "false", r"settings\['reduce_width'\] must be a bool; got 'false'"),
        ("prior", "reduce_width", 0, r"settings\['gmm'\]\['reduce_width'\] must be a bool"),
        ("top", "lr", float("nan"), r"settings\['lr'\] must be a finite number"),
        ("top", "milestones", list(range(5000)), r"settings\['milestones'\] must be a list of at most 1000 ints"),
    ],
)
def test_heat_settings_are_bounded_at_every_level(tmp_path, place, key, value, match):
    # issue 20 item 3: settings.n_hidden_layers=100000 at the top level built for 71 s before a tensor check refused it
    path = _saved_heat(tmp_path)

    def edit(args):
        if place == "top":
            args["settings"][key] = value
        else:
            args["settings"]["gmm"][key] = value

    _edit_settings(path, edit)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match) as info:
        ood.Detector.from_pretrained(tmp_path)
    assert f"config.json of {tmp_path}" in str(info.value) and len(str(info.value)) < 400  # values shown truncated
    assert time.perf_counter() - start < 30  # refused before anything is built (generous: a shared CPU)


@pytest.mark.parametrize("key", ["tie_hidden_weights", "zero_init_residual"])
def test_heat_booleans_are_strictly_typed(tmp_path, key):
    path = _saved_heat(tmp_path)
    _edit_settings(path, lambda args: args.__setitem__(key, "false"))
    with pytest.raises(TypeError, match=rf"rejected by HEAT: {key} must be a bool \(true or false\); got str 'false'"):
        ood.Detector.from_pretrained(tmp_path)


def test_deeply_nested_config_json_is_a_value_error(tmp_path):
    # issue 20 item 3: 200,000 nested '[' raised RecursionError
    _saved_heat(tmp_path / "det")
    (tmp_path / "det" / "config.json").write_text("[" * 200_000)
    with pytest.raises(ValueError, match=r"config.json nests JSON 200000 levels deep; at most 100"):
        ood.Detector.from_pretrained(tmp_path / "det")
    torch.manual_seed(0)
    RetrievalModel("test_resnet", embedding_size=8, image_size=32).save_pretrained(tmp_path / "model")
    (tmp_path / "model" / "config.json").write_text('{"model_args": ' + "[" * 200_000)
    with pytest.raises(ValueError, match="nests JSON 200001 levels deep"):
        RetrievalModel.from_pretrained(tmp_path / "model")


def test_brackets_inside_strings_do_not_count_as_nesting():
    from pml_suprank._safe_json import json_depth
    from pml_suprank._safe_json import loads_json as loads_bounded

    text = json.dumps({"a": '[[[{{{\\"[[[', "b": [[1, {"c": []}]]})
    assert json_depth(text) == 5  # {, [[, {, [
    assert loads_bounded(text, "x") == json.loads(text)
    with pytest.raises(ValueError, match="x is not valid JSON"):
        loads_bounded("{", "x")


# -- finite by construction -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("std", [1e-45, 1e-38, 0.0])
def test_tiny_heat_standardization_std_is_refused_on_load(tmp_path, std):
    # issue 20 item 4: a standardization_std of 1e-45 passed the > 0 check and every score was NaN / inf
    _saved_heat(tmp_path)
    weights = safetensors_torch.load_file(tmp_path / "model.safetensors")
    weights["standardization_std"] = torch.full_like(weights["standardization_std"], std)
    safetensors_torch.save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="'standardization_std'") as info:
        ood.Detector.from_pretrained(tmp_path)
    assert str(tmp_path / "model.safetensors") in str(info.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda x: ood.HEAT(priors=("gmm",), preset="fast", settings={"epochs": 0}),
        lambda x: ood.HEAT(priors=("gmm_std",), preset="fast", settings={"epochs": 0}),
        lambda x: ood.Mahalanobis(normalize=True),
        lambda x: ood.Mahalanobis(normalize=False),
        lambda x: ood.ViM(dim=4, weight=x["weight"], bias=x["bias"]),
    ],
    ids=["heat-gmm", "heat-gmm_std", "ssd+", "mahalanobis", "vim"],
)
def test_fits_on_constant_features_are_refused_as_degenerate(make):
    # issue 20 item 4: HEAT gmm scored +inf and SSD+ 7.7e37 where Mahalanobis refused with "zero variance"
    x = _data(constant=True)
    with pytest.raises(ValueError, match="zero variance"):
        make(x).fit(features=x["features"], std_features=x["std_features"], labels=x["labels"])


@pytest.mark.parametrize(
    "make",
    [
        lambda x: ood.KNN(k=3),
        lambda x: ood.DICE(p=0.5, weight=x["weight"], bias=x["bias"]),
        lambda x: ood.ReAct(weight=x["weight"], bias=x["bias"]),
    ],  # fmt: skip
    ids=["knn", "dice", "react"],
)
def test_detectors_without_fitted_variances_stay_finite_on_constant_features(make):
    x = _data(constant=True)
    det = make(x).fit(features=x["features"], labels=x["labels"])
    scores = det.score(features=x["features"] + 0.01 * torch.randn(N, D, generator=torch.Generator().manual_seed(1)))
    assert torch.isfinite(scores).all()


def test_heat_refuses_non_finite_scores_with_the_reason():
    x = _data()
    heat = ood.HEAT(priors=("gmm",), preset="fast", settings={"epochs": 0})
    heat.fit(features=x["features"], labels=x["labels"])
    heat.standardization_std = torch.full_like(heat.standardization_std, 1e-45)  # bypassing the load check
    with pytest.raises(ValueError, match="not finite .*overflow once standardised"):
        heat.score(features=x["features"][:5])


def test_constant_hybrid_energies_are_refused_at_fit():
    x = _data()
    heat = ood.HEAT(priors=("gmm",), preset="fast", settings={"epochs": 0})
    energies = torch.full((N, 1), 3.0)
    with pytest.raises(ValueError, match=r"prior\(s\) \['gmm'\] is constant"):
        heat._standardization(energies)
    mean, std = heat._standardization(energies + torch.randn(N, 1, generator=torch.Generator().manual_seed(0)))
    assert torch.isfinite(std).all() and bool((std > 0).all())
    del x


@pytest.mark.parametrize("scale", [1e-30, 2.0**-100, 1e-20, 1e19])
def test_evaluator_rescales_tiny_and_huge_embeddings_exactly(scale):
    # issue 20 item 4: at norm 1e-30 the scores underflowed into ties and AP read 0.19 instead of 0.40
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(120, 16, generator=g), dim=1)
    labels = torch.arange(120) % 6
    evaluator = RetrievalEvaluator()
    expected = evaluator.evaluate(emb, labels)
    got = evaluator.evaluate(emb * scale, labels)
    exact = scale == 2.0**-100  # a power of two: the very same ranking, every metric equal
    for key, value in expected.items():
        if torch.is_tensor(value) and value.numel() == 1 or isinstance(value, float):
            tol = 0.0 if exact else 1e-6
            assert float(got[key]) == pytest.approx(float(value), abs=tol), key


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("normalize", lambda v: ood.Mahalanobis(normalize=v)),
        ("normalize", lambda v: ood.KNN(normalize=v)),
        ("tie_hidden_weights", lambda v: ood.HEAT(priors=("gmm",), tie_hidden_weights=v)),
        ("zero_init_residual", lambda v: ood.HEAT(priors=("gmm",), zero_init_residual=v)),
    ],
)
def test_detector_booleans_are_strictly_typed(name, make):
    # issue 20 item 5: "false" is a true value for bool(); a loaded "normalize": "false" built SSD+
    with pytest.raises(TypeError, match=rf"{name} must be a bool \(true or false\); got str 'false'"):
        make("false")


def test_loaded_string_boolean_of_a_detector_is_refused_naming_the_file(tmp_path):
    x = _data()
    ood.Mahalanobis().fit(features=x["features"], labels=x["labels"]).save_pretrained(tmp_path, model_card=False)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_args"]["normalize"] = "false"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(TypeError, match="normalize must be a bool") as info:
        ood.Detector.from_pretrained(tmp_path)
    assert str(tmp_path) in str(info.value)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: ood.KNN(chunk_size=0.5), TypeError, r"chunk_size must be an int >= 1; got float 0\.5"),  # was int 0
        (lambda: ood.NNGuide(chunk_size=10**30), ValueError, r"chunk_size must be an int in \[1, 2147483647\]"),
        (lambda: ood.Energy(temperature=1e300), ValueError, r"temperature must be > 0 and <= 1e\+06; got 1e\+300"),
        (lambda: ood.ODIN(torch.nn.Identity(), temperature=1e7), ValueError, r"temperature must be > 0 and <= 1e\+06"),
    ],
)
def test_detector_sizes_and_temperatures_are_bounded(make, error, match):
    # a chunk of 0 rows or past a C long failed inside torch.split; a huge temperature overflowed the scores
    with pytest.raises(error, match=match):
        make()


def test_loaded_knn_chunk_size_is_refused_naming_the_file(tmp_path):
    x = _data()
    ood.KNN(k=5).fit(features=x["features"]).save_pretrained(tmp_path, model_card=False)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_args"]["chunk_size"] = 0.5
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(TypeError, match="chunk_size must be an int") as info:
        ood.Detector.from_pretrained(tmp_path)
    assert str(tmp_path) in str(info.value)
