"""Regenerate ``ood_posthoc_golden.json``: GEN, RMDS, ASH-P/B/S, SCALE and NNGuide scores computed in float64 numpy
straight from the published formulas (with OpenOOD v1.5's conventions: ``k = D − np.round(D·p/100)`` kept entries,
sklearn ``EmpiricalCovariance`` precisions for RMDS, inner-product k-NN for NNGuide), on stored random inputs.

Run from the repository root: ``python tests/data/make_ood_posthoc_golden.py`` (needs numpy and scikit-learn). The
values are ``conf``-style (higher = more ID) as OpenOOD returns them; the tests compare ``−score``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from sklearn.covariance import EmpiricalCovariance


def lse(x):
    m = x.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def gen_conf(logits, gamma, m):
    p = np.sort(softmax(logits), axis=1)[:, -m:]
    return -(p**gamma * (1 - p) ** gamma).sum(axis=1)


def rmds_conf(z_tr, y_tr, z_te):
    classes = np.unique(y_tr)
    means = np.stack([z_tr[y_tr == c].mean(0) for c in classes])
    prec = EmpiricalCovariance(assume_centered=False).fit(z_tr - means[np.searchsorted(classes, y_tr)]).precision_
    mu0 = z_tr.mean(0)
    prec0 = EmpiricalCovariance(assume_centered=False).fit(z_tr - mu0).precision_
    d0 = np.einsum("nd,de,ne->n", z_te - mu0, prec0, z_te - mu0)
    dk = np.stack([np.einsum("nd,de,ne->n", z_te - m, prec, z_te - m) for m in means], axis=1)
    return (-(dk - d0[:, None])).max(axis=1)


def keep(d, p):
    return d - int(np.round(d * p / 100.0))


def shape(z, p, how):
    out = np.zeros_like(z)
    k = keep(z.shape[1], p)
    for i, row in enumerate(z):
        top = np.argsort(-row, kind="stable")[:k]
        s1 = row.sum()
        if how == "p":
            out[i, top] = row[top]
        elif how == "b":
            out[i, top] = s1 / k
        elif how == "s":
            out[i, top] = row[top] * np.exp(s1 / row[top].sum())
        else:  # scale
            out[i] = row * np.exp(s1 / row[top].sum())
    return out


def energy_conf(z, w, b):
    return lse(z @ w.T + b)


def nnguide_conf(z_tr, logits_tr, z_te, logits_te, k):
    bank = z_tr / np.linalg.norm(z_tr, axis=1, keepdims=True) * lse(logits_tr)[:, None]
    q = z_te / np.linalg.norm(z_te, axis=1, keepdims=True)
    sims = np.sort(q @ bank.T, axis=1)[:, -k:]
    return sims.mean(axis=1) * lse(logits_te)


def main():
    rng = np.random.default_rng(2023)
    n_tr, n_te, d, c = 48, 12, 10, 4
    # post-ReLU-like features with distinct entries (no ties at a pruning threshold)
    z_tr = np.maximum(rng.normal(0.3, 1.0, (n_tr, d)), 0) + rng.uniform(1e-3, 1e-2, (n_tr, d))
    z_te = np.maximum(rng.normal(0.3, 1.2, (n_te, d)), 0) + rng.uniform(1e-3, 1e-2, (n_te, d))
    y_tr = np.arange(n_tr) % c
    w, b = rng.normal(0, 0.5, (c, d)), rng.normal(0, 0.1, c)
    l_tr, l_te = z_tr @ w.T + b, z_te @ w.T + b
    golden = {
        "inputs": {
            "features_train": z_tr.tolist(),
            "labels_train": y_tr.tolist(),
            "features_test": z_te.tolist(),
            "fc_weight": w.tolist(),
            "fc_bias": b.tolist(),
        },
        "openood_conf": {
            "GEN_gamma0.1_M100": gen_conf(l_te, 0.1, 100).tolist(),
            "GEN_gamma0.5_M2": gen_conf(l_te, 0.5, 2).tolist(),
            "RMDS": rmds_conf(z_tr, y_tr, z_te).tolist(),
            "ASH_p_65": energy_conf(shape(z_te, 65, "p"), w, b).tolist(),
            "ASH_b_65": energy_conf(shape(z_te, 65, "b"), w, b).tolist(),
            "ASH_s_90": energy_conf(shape(z_te, 90, "s"), w, b).tolist(),
            "SCALE_85": energy_conf(shape(z_te, 85, "scale"), w, b).tolist(),
            "NNGuide_k5_alpha1": nnguide_conf(z_tr, l_tr, z_te, l_te, 5).tolist(),
        },
    }
    path = Path(__file__).with_name("ood_posthoc_golden.json")
    path.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
