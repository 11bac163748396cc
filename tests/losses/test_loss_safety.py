"""Bad values are named, never trained on silently: 1-D labels given to hierarchical losses without a hierarchy,
invalid ``level_weights``, embeddings or labels that do not fit a proxy loss, and batches of batches (a batch sampler
passed as ``sampler=``)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pml_suprank import losses
from pml_suprank.relevance import Hierarchy
from pml_suprank.samplers import MPerClassBatchSampler

D = 8
C = 4
# fine class f -> [f, f // 2]: 4 fine classes under 2 coarse ones
TABLE = torch.stack([torch.arange(C), torch.arange(C) // 2], 1)


def _batch(n: int = 16, dim: int = D, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(n, dim, generator=g, dtype=torch.float64), dim=1)
    fine = torch.arange(n) % C
    return emb.requires_grad_(True), fine


HIERARCHICAL = {
    "SupHAPLoss": lambda **kw: losses.SupHAPLoss(**kw),
    "SupNDCGLoss": lambda **kw: losses.SupNDCGLoss(**kw),
    "HAPPIERLoss": lambda **kw: losses.HAPPIERLoss(num_classes=C, embedding_size=D, **kw),
    "RODNDCGLoss": lambda **kw: losses.RODNDCGLoss(num_classes=C, embedding_size=D, **kw),
    "CSLLoss": lambda **kw: losses.CSLLoss(num_classes=C, embedding_size=D, margins=(0.25, 0.35), **kw),
}


@pytest.mark.parametrize("name", sorted(HIERARCHICAL))
def test_hierarchical_loss_refuses_1d_labels_without_hierarchy(name):
    emb, fine = _batch()
    with pytest.raises(ValueError, match=r"labels.*\(N, L\).*hierarchy=") as info:
        HIERARCHICAL[name]()(emb, fine)
    assert "silently" in str(info.value)
    # the two ways out named by the message both work, and agree
    torch.manual_seed(0)  # same proxies for both (proxy losses)
    two_d = HIERARCHICAL[name]()(emb, TABLE[fine])
    torch.manual_seed(0)
    with_table = HIERARCHICAL[name](hierarchy=Hierarchy(TABLE))(emb, fine)
    torch.testing.assert_close(two_d, with_table)
    assert torch.isfinite(two_d)


@pytest.mark.parametrize("name", ["SupHAPLoss", "SupNDCGLoss"])
def test_hierarchical_loss_refuses_1d_ref_labels_without_hierarchy(name):
    emb, fine = _batch()
    ref, ref_fine = _batch(seed=1)
    with pytest.raises(ValueError, match=r"ref_labels must have the label columns of labels"):
        # 2-D query labels, 1-D reference labels: rejected by shape, naming ref_labels
        HIERARCHICAL[name]()(emb, TABLE[fine], None, ref.detach(), ref_fine)
    with pytest.raises(ValueError, match=r"labels.*hierarchy="):
        HIERARCHICAL[name]()(emb, fine, None, ref.detach(), ref_fine)


def test_csl_register_labels_refuses_1d_labels_without_hierarchy():
    loss = losses.CSLLoss(num_classes=C, embedding_size=D, margins=(0.25, 0.35))
    with pytest.raises(ValueError, match=r"labels.*hierarchy="):
        loss.register_labels(torch.arange(C))


def test_single_level_is_explicit():
    emb, fine = _batch()
    hap = losses.SupHAPLoss()(emb, fine[:, None])
    ap = losses.SupAPLoss()(emb, fine)
    torch.testing.assert_close(hap, ap)


@pytest.mark.parametrize(
    "weights, match",
    [
        ([float("nan"), 1.0], "finite"),
        ([float("inf"), 1.0], "finite"),
        ([0.0, 0.0], "all zero"),
        ([-1.0, 2.0], "non-negative"),
        ([], "one weight per level"),
    ],
)
def test_sup_hap_level_weights_are_checked(weights, match):
    with pytest.raises(ValueError, match=f"level_weights must .*{match}"):
        losses.SupHAPLoss(level_weights=weights)


def test_sup_hap_level_weights_type_and_length():
    with pytest.raises(TypeError, match="level_weights"):
        losses.SupHAPLoss(level_weights="12")
    with pytest.raises(TypeError, match="level_weights"):
        losses.SupHAPLoss(level_weights=[1.0, None])
    with pytest.raises(ValueError, match=r"level_weights must be 2 weights"):
        losses.SupHAPLoss(hierarchy=TABLE, level_weights=[1.0, 1.0, 1.0])
    emb, fine = _batch()
    with pytest.raises(ValueError, match="level_weights has 3 entries"):
        losses.SupHAPLoss(level_weights=[1.0, 1.0, 1.0])(emb, TABLE[fine])
    # valid weights (a zero weight among positive ones, a tensor) still work
    for weights in ([0.0, 1.0], torch.tensor([0.5, 0.5])):
        value = losses.SupHAPLoss(level_weights=weights)(emb, TABLE[fine])
        assert torch.isfinite(value)


PROXY = {
    "ClusterLoss": lambda: losses.ClusterLoss(num_classes=C, embedding_size=D),
    "HAPPIERLoss": lambda: losses.HAPPIERLoss(num_classes=C, embedding_size=D),
    "RODNDCGLoss": lambda: losses.RODNDCGLoss(num_classes=C, embedding_size=D),
    "ROADMAPLoss_proxy": lambda: losses.ROADMAPLoss(decomposability="proxy", num_classes=C, embedding_size=D),
    "RODRecallLoss_proxy": lambda: losses.RODRecallLoss(decomposability="proxy", num_classes=C, embedding_size=D),
    "SupAPLoss_proxy": lambda: losses.CombinedRankLoss(losses.SupAPLoss(), "proxy", num_classes=C, embedding_size=D),
    "CSLLoss": lambda: losses.CSLLoss(num_classes=C, embedding_size=D, margins=(0.25, 0.35), hierarchy=TABLE),
}


@pytest.mark.parametrize("name", sorted(PROXY))
def test_proxy_loss_checks_embedding_size(name):
    emb, fine = _batch(dim=D + 3)
    labels = TABLE[fine] if name in ("HAPPIERLoss", "RODNDCGLoss") else fine
    with pytest.raises(ValueError, match=rf"embedding_size={D}.*\(16, {D + 3}\)"):
        PROXY[name]()(emb, labels)


@pytest.mark.parametrize("name", sorted(PROXY))
def test_proxy_loss_checks_labels_against_num_classes(name):
    emb, fine = _batch()
    hierarchical = name in ("HAPPIERLoss", "RODNDCGLoss")
    too_big = fine.clone()
    too_big[0] = C
    labels = torch.stack([too_big, too_big // 2], 1) if hierarchical else too_big
    # CSLLoss with a hierarchy names the hierarchy's size (its table has num_classes rows)
    with pytest.raises(ValueError, match=rf"labels.*(num_classes={C}|num_fine={C})"):
        PROXY[name]()(emb, labels)
    negative = fine.clone()
    negative[0] = -1
    labels = torch.stack([negative, negative.clamp_min(0) // 2], 1) if hierarchical else negative
    with pytest.raises(ValueError, match="labels"):
        PROXY[name]()(emb, labels)


def test_proxy_loss_with_the_right_sizes_still_trains():
    emb, fine = _batch()
    for name, make in PROXY.items():
        labels = TABLE[fine] if name in ("HAPPIERLoss", "RODNDCGLoss") else fine
        value = make()(emb, labels)
        assert torch.isfinite(value), name


@pytest.mark.parametrize("loss", [losses.SupAPLoss(), losses.ClusterLoss(num_classes=C, embedding_size=D)])
def test_batch_of_batches_names_batch_sampler(loss):
    # a pml_suprank batch sampler given as sampler= (PML style): every "index" is a whole batch, so a DataLoader with
    # batch_size=2 yields (2, 8, ...) batches; the first loss call says what to do
    labels = torch.arange(32) % C
    dataset = TensorDataset(torch.randn(32, D), labels)
    sampler = MPerClassBatchSampler(labels, m=2, batch_size=8)
    inputs, batch_labels = next(iter(DataLoader(dataset, sampler=sampler, batch_size=2)))
    assert inputs.shape == (2, 8, D)
    with pytest.raises(ValueError, match=r"embeddings must have shape \(N, D\).*batch_sampler=") as info:
        loss(inputs, batch_labels)
    assert "sampler=" in str(info.value)
    # the intended use works
    inputs, batch_labels = next(iter(DataLoader(dataset, batch_sampler=sampler)))
    assert torch.isfinite(loss(torch.nn.functional.normalize(inputs, dim=1), batch_labels))


def test_nested_labels_name_batch_sampler():
    emb, _ = _batch(n=2)
    with pytest.raises(ValueError, match=r"labels must have shape \(N,\).*batch_sampler="):
        losses.SupAPLoss()(emb, torch.zeros(2, 8, dtype=torch.long))
