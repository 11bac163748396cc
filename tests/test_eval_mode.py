"""Embedding or scoring a model in the middle of training leaves every submodule in the mode it was in: a BatchNorm
frozen by ``RetrievalModel.freeze_batch_norm`` stays frozen (``model.train(True)`` afterwards unfroze it)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pml_suprank._eval_mode import eval_mode
from pml_suprank.metrics import compute_embeddings
from pml_suprank.models import RetrievalModel
from pml_suprank.ood.features import extract_model_features, feature_map_positions
from pml_suprank.search.from_model import embed_inputs


def _modes(model: nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


@pytest.fixture()
def frozen_bn_model():
    model = RetrievalModel("test_resnet", embedding_size=8).train().freeze_batch_norm()
    before = _modes(model)
    assert True in before and False in before  # training, BatchNorm layers in eval mode
    return model, before


@pytest.mark.parametrize("use", ["compute_embeddings", "embed_inputs", "extract_model_features", "positions"])
def test_embedding_mid_training_keeps_frozen_batch_norm_frozen(frozen_bn_model, use):
    model, before = frozen_bn_model
    images = torch.rand(4, 3, 32, 32)
    if use == "compute_embeddings":
        compute_embeddings(model, [(images, torch.arange(4))])
    elif use == "embed_inputs":
        embed_inputs(model, images)
    elif use == "extract_model_features":
        extract_model_features(model, [images], features="embedding")
    else:
        assert feature_map_positions(model, 32) >= 1
    assert _modes(model) == before


def test_modes_are_restored_after_an_exception_and_the_block_runs_in_eval_mode():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Dropout()).train()
    model[1].eval()
    before = _modes(model)
    with pytest.raises(RuntimeError, match="inside"), eval_mode(model) as inside:
        assert inside is model and not any(_modes(model))
        raise RuntimeError("inside")
    assert _modes(model) == before == [True, True, False, True]
