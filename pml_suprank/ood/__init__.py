"""Post-hoc out-of-distribution detection: HEAT and the standard baselines, with one ``fit`` / ``score`` API.

Every detector is fitted on in-distribution features (and labels / logits where needed) and returns outlier scores
(higher = more OOD)::

    from pml_suprank import ood
    feats = ood.extract_features(timm_model, train_loader)          # z, σ (std-pooled), logits, labels
    heat = ood.HEAT(head=timm_model.get_classifier()).fit(**feats.as_kwargs())
    test = ood.extract_features(timm_model, test_loader)
    scores = heat.score(**test.as_kwargs())
    ood.metrics.auroc(scores_id, scores_ood); ood.metrics.fpr_at_tpr(scores_id, scores_ood, tpr=0.95)
"""

from . import metrics
from .base import Detector, NotFittedError
from .baselines import DICE, KNN, MSP, ODIN, Energy, Mahalanobis, MaxLogit, ReAct, ViM
from .ebm import ResidualEnergyMLP, contrastive_divergence_loss, polynomial_schedule, sgld_sample, train_residual
from .features import OODFeatures, extract_features, pool_feature_map
from .heat import HEAT, PRESETS, compose_energies, standardize
from .priors import ClassConditionalGaussian, EnergyLogitsPrior, energy_logits

DETECTORS = ("HEAT", "MSP", "MaxLogit", "Energy", "ODIN", "Mahalanobis", "KNN", "ViM", "DICE", "ReAct")

__all__ = [
    "DETECTORS",
    "DICE",
    "HEAT",
    "KNN",
    "MSP",
    "ODIN",
    "PRESETS",
    "ClassConditionalGaussian",
    "Detector",
    "Energy",
    "EnergyLogitsPrior",
    "Mahalanobis",
    "MaxLogit",
    "NotFittedError",
    "OODFeatures",
    "ReAct",
    "ResidualEnergyMLP",
    "ViM",
    "compose_energies",
    "contrastive_divergence_loss",
    "energy_logits",
    "extract_features",
    "metrics",
    "polynomial_schedule",
    "pool_feature_map",
    "sgld_sample",
    "standardize",
    "train_residual",
]
