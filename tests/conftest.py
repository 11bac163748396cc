"""Shared fixtures: dtype/device parametrisation and the golden vectors of tests/data (reference-code numbers)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch

DATA = Path(__file__).parent / "data"

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(params=[torch.float32, torch.float64], ids=["f32", "f64"])
def dtype(request) -> torch.dtype:
    return request.param


def _decode(obj):
    if obj == "NaN":
        return float("nan")
    if isinstance(obj, list):
        return [_decode(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _decode(v) for k, v in obj.items()}
    return obj


@cache
def load_golden(name: str) -> dict:
    """Load ``tests/data/<name>.json`` with the string ``"NaN"`` decoded to ``float('nan')``."""
    with open(DATA / f"{name}.json") as f:
        return _decode(json.load(f))


@pytest.fixture(scope="session")
def ranking_golden() -> dict:
    return load_golden("ranking_golden")


@pytest.fixture(scope="session")
def heat_golden() -> dict:
    return load_golden("heat_golden")


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a whole module (``pytestmark = pytest.mark.usefixtures("one_thread")``): in-process
    training runs, where oversubscribed OpenMP threads are pathologically slow on a shared CPU."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(autouse=True)
def _few_threads():
    # keep tests predictable on the 2-core CI machine
    prev = torch.get_num_threads()
    torch.set_num_threads(min(prev, 2))
    yield
    torch.set_num_threads(prev)
