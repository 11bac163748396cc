"""The usage snippet of a detector's model card runs as written (HEAT with its std-pooled prior included: the old
snippet ``detector.score(features=z, logits=logits)`` raised "the 'gmm_std' prior needs std_features=")."""

from __future__ import annotations

import re

import pytest
import torch

from pml_suprank import ood

timm = pytest.importorskip("timm")


@pytest.mark.parametrize("priors", [("gmm", "gmm_std", "el"), ("gmm",)])
def test_card_usage_snippet_runs(tmp_path, monkeypatch, priors):
    torch.manual_seed(0)
    classifier = timm.create_model("test_resnet", num_classes=3, pretrained=False).eval()
    images = torch.rand(12, 3, 64, 64)
    train = ood.extract_features(classifier, [{"image": images, "labels": torch.arange(12) % 3}])
    heat = ood.HEAT(priors=priors, preset="fast", settings={"epochs": 1}, head=classifier.get_classifier())
    heat.fit(**train.as_kwargs())
    heat.save_pretrained(tmp_path / "heat")
    code = re.search(r"```python\n(.*?)```", (tmp_path / "heat" / "README.md").read_text(), re.S).group(1)
    monkeypatch.chdir(tmp_path)  # the snippet loads the folder by its local path ./heat
    namespace = {"classifier": classifier, "images": images[:4]}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["scores"].shape == (4,)
    assert torch.allclose(namespace["scores"], heat.score(**{k: v[:4] for k, v in train.as_kwargs().items()
                                                                if k != "labels"}), rtol=1e-2, atol=1e-2)  # fmt: skip
