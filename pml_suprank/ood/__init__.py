"""Post-hoc out-of-distribution detection: HEAT and the standard baselines, with one ``fit`` / ``score`` API.

Every detector is fitted on in-distribution features (and labels / logits where needed) and returns outlier scores
(higher = more OOD)::

    from pml_suprank import ood
    feats = ood.extract_features(timm_model, train_loader)          # z, σ (std-pooled), logits, labels
    heat = ood.HEAT(head=timm_model.get_classifier()).fit(**feats.as_kwargs())
    scores = heat.score(**ood.extract_features(timm_model, test_loader).as_kwargs())
    ood.metrics.auroc(scores_id, scores_ood); ood.metrics.fpr_at_tpr(scores_id, scores_ood, tpr=0.95)

Subclassing :class:`Detector` (or :class:`Prior` with ``name="..."``) registers the class: ``ood.list_detectors()``,
``ood.get_detector(name)``, ``Detector.from_pretrained``.
"""

from . import metrics
from .base import Detector, NotFittedError, energy_logits, get_detector, list_detectors
from .ebm import ResidualEnergyMLP, contrastive_divergence_loss, polynomial_schedule, sgld_sample, train_residual
from .feature_store import SavedFeatures, load_features, save_features
from .features import OODFeatures, extract_features, pool_feature_map

# detectors, in the order of ``list_detectors()``: importing a module defines (registers) its detector
from .heat import HEAT, compose_energies, standardize  # isort: skip
from .logit_scores import MSP, MaxLogit, Energy, GEN, ODIN  # isort: skip
from .mahalanobis import Mahalanobis, RMDS  # isort: skip
from .knn import KNN, NNGuide  # isort: skip
from .vim import ViM  # isort: skip
from .shaping import ReAct, DICE, ASH, SCALE  # isort: skip
from .priors import PRESETS, ClassConditionalGaussian, ELPrior, GMMPrior, GMMStdPrior, Prior, get_prior, list_priors

from .benchmark import BenchmarkResult, benchmark  # isort: skip


__all__ = [
    "ASH",
    "BenchmarkResult",
    "GEN",
    "NNGuide",
    "RMDS",
    "SCALE",
    "DICE",
    "HEAT",
    "KNN",
    "MSP",
    "ODIN",
    "PRESETS",
    "Detector",
    "Energy",
    "Mahalanobis",
    "MaxLogit",
    "NotFittedError",
    "Prior",
    "ReAct",
    "SavedFeatures",
    "ViM",
    "benchmark",
    "extract_features",
    "get_detector",
    "get_prior",
    "list_detectors",
    "list_priors",
    "load_features",
    "metrics",
    "save_features",
]
