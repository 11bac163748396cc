"""The post-hoc OOD baselines, one module each, re-exported here for the imports written before the split.

``MSP`` (:mod:`.msp`), ``MaxLogit`` (:mod:`.max_logit`), ``Energy`` (:mod:`.energy`), ``ODIN`` (:mod:`.odin`),
``Mahalanobis`` / SSD+ (:mod:`.mahalanobis`), ``KNN`` (:mod:`.knn`), ``ViM`` (:mod:`.vim`), ``DICE`` (:mod:`.dice`),
``ReAct`` (:mod:`.react`). Every score is an outlier score (higher = more OOD), i.e. the negative of OpenOOD's
``conf``. Detectors that need the classifier head (ViM, DICE, ReAct) take ``weight`` ``(C, D)`` and ``bias``
``(C,)`` or an ``nn.Linear`` ``head``; ODIN takes the network mapping inputs to logits.
"""

from __future__ import annotations

from .base import Detector, check_features  # noqa: F401 - names importable from this module before the split
from .dice import DICE
from .energy import Energy
from .head import _check_logits, _head_params, _HeadDetector  # noqa: F401
from .knn import KNN
from .mahalanobis import Mahalanobis
from .max_logit import MaxLogit
from .metrics import quantile_linear  # noqa: F401
from .msp import MSP
from .odin import ODIN
from .priors import ClassConditionalGaussian, energy_logits  # noqa: F401
from .react import ReAct
from .vim import ViM

__all__ = ["MSP", "MaxLogit", "Energy", "ODIN", "Mahalanobis", "KNN", "ViM", "DICE", "ReAct"]
