"""The Trainer evaluates on the accelerator's device (the CPU only when that is the device): the device reaches the
evaluator's ranking through the Trainer's own code path (the evaluator runs; nothing is mocked away), and the
metrics are those of the evaluator called directly on the same embeddings."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("timm")

from pml_suprank import data, losses  # noqa: E402
from pml_suprank.metrics import RetrievalEvaluator  # noqa: E402
from pml_suprank.training import Trainer, TrainingConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


class RecordingEvaluator(RetrievalEvaluator):
    """A real evaluator that records the device each ranking ran on."""

    used: list = []

    def _per_query(self, *args):
        RecordingEvaluator.used.append(self.device)
        return super()._per_query(*args)


def _trainer(tmp_path, evaluator):
    from accelerate import Accelerator

    from pml_suprank.models import RetrievalModel

    torch.manual_seed(0)
    acc = Accelerator(cpu=not torch.cuda.is_available())
    model = RetrievalModel("test_resnet", embedding_size=16, image_size=16)
    tf = data.build_transforms(model.data_config, train=False)
    train = data.SyntheticShapes("train", num_per_class=4, image_size=16, transform=tf)
    test = data.SyntheticShapes("test", num_per_class=2, image_size=16, transform=tf)
    config = TrainingConfig(output_dir=str(tmp_path), epochs=1, batch_size=16, samples_per_class=4, eval_every=0,
                            hierarchical_labels=True, seed=3)  # fmt: skip
    loss = losses.HAPPIERLoss(num_classes=54, embedding_size=16)
    return Trainer(acc, model, loss, train, config, test_dataset=test, evaluator=evaluator), acc


def test_trainer_evaluates_on_the_accelerator_device(tmp_path):
    RecordingEvaluator.used.clear()
    trainer, acc = _trainer(tmp_path, RecordingEvaluator(k_values=(1, 4)))
    metrics = trainer.evaluate()
    assert RecordingEvaluator.used == [acc.device]  # the accelerator's device reached the ranking
    assert trainer.evaluator.device is None  # the evaluator given by the user is unchanged
    emb, labels, _ = trainer.last_embeddings
    direct = RetrievalEvaluator(k_values=(1, 4)).evaluate(emb, labels)
    assert metrics.keys() == {k for k, v in direct.items() if isinstance(v, (int, float))}
    for key, value in direct.items():
        assert metrics[key] == pytest.approx(value, abs=1e-9, nan_ok=True), key

    # an evaluator built with its own device keeps it
    RecordingEvaluator.used.clear()
    trainer.evaluator = RecordingEvaluator(k_values=(1, 4), device="cpu")
    trainer.evaluate()
    assert RecordingEvaluator.used == [torch.device("cpu")]
