"""Worker of tests/test_distributed.py: one gloo process of a 2-process run (started by the test, not by pytest).

Every process trains the same tiny model wrapped in DDP on its slice of a global batch, through
``DistributedRankLoss`` (both modes) and ``RankingMemory``; it also runs the single-process computation on the
concatenated global batch (no process group involved) and records the largest differences of loss values, DDP-averaged
parameter gradients, loss-parameter (proxy) gradients and memory contents. Rank 0 writes them as JSON to ``--out``.

Usage: ``python tests/_distributed_worker.py --out f.json --rank r --world-size 2 --port p`` (one per rank)
"""

from __future__ import annotations

import argparse
import copy
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from pytorch_metric_learning.losses import ContrastiveLoss
from torch.nn.parallel import DistributedDataParallel as DDP

from pml_suprank import losses
from pml_suprank.collectives import all_gather, all_gather_with_grad, gather_batch
from pml_suprank.losses import DistributedRankLoss
from pml_suprank.memory import RankingMemory

D_IN, D, STEPS = 6, 8, 3


def loss_factories():
    table = torch.tensor([[0, 0], [1, 0], [2, 1], [3, 1]])
    return {
        "SupAP": (lambda: losses.SupAPLoss(), False),
        "SupAP_include_self": (lambda: losses.SupAPLoss(include_self=True), False),
        "SmoothAP": (lambda: losses.SmoothAPLoss(), False),
        "ROADMAP": (lambda: losses.ROADMAPLoss(), False),
        "SmoothAP+calibration": (lambda: losses.CombinedRankLoss(losses.SmoothAPLoss(), "calibration", 0.4), False),
        "ROADMAP_proxy": (
            lambda: losses.ROADMAPLoss(decomposability="proxy", num_classes=4, embedding_size=D),
            False,
        ),
        "HAPPIER": (lambda: losses.HAPPIERLoss(num_classes=4, embedding_size=D), True),
        "HAPPIER_hierarchy_1d": (lambda: losses.HAPPIERLoss(num_classes=4, embedding_size=D, hierarchy=table), False),
        "SupNDCG": (lambda: losses.SupNDCGLoss(), True),
        "Contrastive_pml": (lambda: ContrastiveLoss(), False),
    }


def global_batch(step: int, sizes: list[int], two_d: bool):
    n = sum(sizes)
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(n, D_IN, generator=g, dtype=torch.float64)
    fine = (torch.arange(n) + step) % 4
    labels = torch.stack([fine, fine // 2], 1) if two_d else fine
    indices = (torch.arange(n) + 5 * step) % 24  # dataset indices for the index-memory
    return x, labels, indices


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max()) if a.numel() else 0.0


def run_case(name, make_loss, two_d, wrapper, sizes, rank, ws):
    torch.manual_seed(0)
    model = torch.nn.Linear(D_IN, D).double()
    ref_model = copy.deepcopy(model)
    torch.manual_seed(1)
    loss_fn = make_loss().double()
    ref_loss = copy.deepcopy(loss_fn)
    ddp = DDP(model)
    if wrapper in ("local_queries", "all"):
        dist_fn, ref_fn = DistributedRankLoss(loss_fn, mode=wrapper), ref_loss
    else:
        mode = "index" if wrapper == "memory_index" else "fifo"
        size = 24 if mode == "index" else 40
        kw = {"mode": mode, "dtype": torch.float64, "get_first": wrapper == "memory_get_first"}
        dist_fn = RankingMemory(loss_fn, D, size, **kw)
        ref_fn = RankingMemory(ref_loss, D, size, distributed=False, **kw)
    lo = sum(sizes[:rank])
    out = {"loss": 0.0, "grad": 0.0, "loss_params_grad": 0.0, "memory": 0.0, "embedding_grad": 0.0}
    for step in range(STEPS):
        x, labels, indices = global_batch(step, sizes, two_d)
        sl = slice(lo, lo + sizes[rank])
        # distributed
        xl = x[sl].clone().requires_grad_(True)
        emb = F.normalize(ddp(xl), dim=1)
        args = (emb, labels[sl]) if wrapper in ("local_queries", "all") else (emb, labels[sl], indices[sl])
        loss = dist_fn(*args)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        loss_grads = []
        for p in loss_fn.parameters():
            g = p.grad.clone()
            dist.all_reduce(g)  # what DDP would do for a prepared loss with parameters
            loss_grads.append(g / ws)
        x_grad = all_gather(xl.grad)  # d(loss on this rank)/dx: sums to ws x the single-process input gradient
        # single process on the concatenated batch
        xs = x.clone().requires_grad_(True)
        emb_s = F.normalize(ref_model(xs), dim=1)
        args_s = (emb_s, labels) if wrapper in ("local_queries", "all") else (emb_s, labels, indices)
        loss_s = ref_fn(*args_s)
        loss_s.backward()
        out["loss"] = max(out["loss"], abs(float(loss.detach()) - float(loss_s.detach())))
        for g, p in zip(grads, ref_model.parameters(), strict=True):
            out["grad"] = max(out["grad"], max_diff(g, p.grad))
        for g, p in zip(loss_grads, ref_loss.parameters(), strict=True):
            out["loss_params_grad"] = max(out["loss_params_grad"], max_diff(g, p.grad))
        out["embedding_grad"] = max(out["embedding_grad"], max_diff(x_grad / ws, xs.grad))
        if isinstance(dist_fn, RankingMemory):
            out["memory"] = max(out["memory"], max_diff(dist_fn.embeddings, ref_fn.embeddings))
            out["memory"] = max(out["memory"], max_diff(dist_fn.labels.double(), ref_fn.labels.double()))
            out["memory"] = max(out["memory"], float(int(dist_fn.ptr) != int(ref_fn.ptr)))
        for m in (model, ref_model, loss_fn, ref_loss):
            m.zero_grad(set_to_none=True)
        with torch.no_grad():  # a plain SGD step so that later steps see a different model
            for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
                p -= 0.5 * q.grad if q.grad is not None else 0.0
    return out


def check_gather(rank: int, ws: int) -> float:
    """all_gather_with_grad with unequal sizes: values in rank order, gradient = sum over ranks."""
    n = 2 + rank
    x = torch.full((n, 3), float(rank), dtype=torch.float64, requires_grad=True)
    y = all_gather_with_grad(x)
    expect = torch.cat([torch.full((2 + r, 3), float(r), dtype=torch.float64) for r in range(ws)])
    (y * torch.arange(y.shape[0], dtype=torch.float64)[:, None]).sum().backward()
    lo = sum(2 + r for r in range(rank))
    grad_expect = ws * torch.arange(lo, lo + n, dtype=torch.float64)[:, None].expand(n, 3)
    return max(max_diff(y, expect), max_diff(x.grad, grad_expect))


def check_gather_batch(rank: int, ws: int) -> float:
    """gather_batch with unequal sizes: embeddings (gradient summed over ranks), labels, indices and local rows."""
    n = 2 + rank
    lo = sum(2 + r for r in range(rank))
    x = torch.full((n, 3), float(rank), dtype=torch.float64, requires_grad=True)
    labels = torch.stack([torch.arange(lo, lo + n), torch.full((n,), rank)], 1)
    batch = gather_batch(x, labels, indices=10 + torch.arange(lo, lo + n))
    total = sum(2 + r for r in range(ws))
    expect = torch.cat([torch.full((2 + r, 3), float(r), dtype=torch.float64) for r in range(ws)])
    labels_expect = torch.stack([torch.arange(total), torch.cat([torch.full((2 + r,), r) for r in range(ws)])], 1)
    (batch.embeddings * torch.arange(total, dtype=torch.float64)[:, None]).sum().backward()
    grad_expect = ws * torch.arange(lo, lo + n, dtype=torch.float64)[:, None].expand(n, 3)
    exact = (
        torch.equal(batch.labels, labels_expect)
        and torch.equal(batch.indices, 10 + torch.arange(total))
        and torch.equal(batch.local, torch.arange(lo, lo + n))
        and not batch.labels.requires_grad
    )
    return max(max_diff(batch.embeddings, expect), max_diff(x.grad, grad_expect), 0.0 if exact else 1.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--multilabel", action="store_true", help="run only the multi-label cases")
    args = parser.parse_args()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=args.world_size
    )
    torch.set_num_threads(1)
    rank, ws = dist.get_rank(), dist.get_world_size()
    if args.multilabel:
        _write_results(args.out, rank, multilabel_results(rank, ws))
        return
    results = {"gather": check_gather(rank, ws), "gather_batch": check_gather_batch(rank, ws)}
    factories = loss_factories()
    plan = []
    for name in factories:
        for wrapper in ("local_queries", "all", "memory"):
            plan.append((name, wrapper, [8] * ws))
    plan += [("SupAP", "local_queries", [6, 10][:ws]), ("SupAP", "memory", [6, 10][:ws])]
    plan += [("SupAP", "memory_index", [8] * ws), ("HAPPIER", "memory_index", [8] * ws)]
    plan += [("ROADMAP", "memory_get_first", [8] * ws)]
    for name, wrapper, sizes in plan:
        make, two_d = factories[name]
        key = f"{name}/{wrapper}/{'-'.join(map(str, sizes))}"
        try:
            res = run_case(name, make, two_d, wrapper, sizes, rank, ws)
        except Exception as err:  # reported, not hidden: the test fails on any error entry
            res = {"error": f"{type(err).__name__}: {err}"}
        vals = torch.tensor([v for k, v in sorted(res.items()) if k != "error"] or [0.0], dtype=torch.float64)
        dist.all_reduce(vals, op=dist.ReduceOp.MAX)
        if "error" not in res:
            res = dict(zip(sorted(res), vals.tolist(), strict=True))
        results[key] = res
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------ multi-label
ML_TABLE = torch.tensor([[0, 0], [1, 0], [2, 1], [3, 1]])


def multilabel_factories():
    """Multi-label losses (``relevance="multilabel"``) of ``--multilabel`` runs (tests/test_multilabel_memory.py)."""
    return {
        "SupHAP_multilabel": lambda: losses.SupHAPLoss(hierarchy=ML_TABLE, relevance="multilabel"),
        "HAPPIER_multilabel": lambda: losses.HAPPIERLoss(
            num_classes=4, embedding_size=D, hierarchy=ML_TABLE, relevance="multilabel"
        ),
    }


def multilabel_batch(step: int, sizes: list[int]):
    """Global batch whose rank ``r`` rows carry label sets of width ``2 + r`` (``-1`` padded), and the sets of
    every rank padded to the widest one (what the single process sees)."""
    n, ws = sum(sizes), len(sizes)
    g = torch.Generator().manual_seed(200 + step)
    x = torch.randn(n, D_IN, generator=g, dtype=torch.float64)
    sets = torch.randint(0, 4, (n, 1 + ws), generator=g)
    sets[torch.rand(n, 1 + ws, generator=g) < 0.4] = -1
    sets[:, 0] = (torch.arange(n) + step) % 4
    per_rank, lo = [], 0
    for r, size in enumerate(sizes):
        part = sets[lo : lo + size, : 2 + r].clone()
        per_rank.append(part)
        lo += size
    full = torch.cat([torch.cat([p, p.new_full((p.shape[0], 1 + ws - p.shape[1]), -1)], 1) for p in per_rank])
    indices = (torch.arange(n) + 5 * step) % 24
    return x, per_rank, full, indices


def run_multilabel_case(make_loss, wrapper, sizes, rank, ws):
    """Loss, DDP-averaged gradient and memory of a multi-label loss vs the single process (like run_case)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(D_IN, D).double()
    ref_model = copy.deepcopy(model)
    torch.manual_seed(1)
    loss_fn = make_loss().double()
    ref_loss = copy.deepcopy(loss_fn)
    ddp = DDP(model)
    if wrapper in ("local_queries", "all"):
        dist_fn, ref_fn = DistributedRankLoss(loss_fn, mode=wrapper), ref_loss
    else:
        dist_fn = RankingMemory(loss_fn, D, 40, dtype=torch.float64)
        ref_fn = RankingMemory(ref_loss, D, 40, distributed=False, dtype=torch.float64)
    lo = sum(sizes[:rank])
    out = {"loss": 0.0, "grad": 0.0, "memory": 0.0}
    for step in range(STEPS):
        x, per_rank, full, _ = multilabel_batch(step, sizes)
        emb = F.normalize(ddp(x[lo : lo + sizes[rank]].clone()), dim=1)
        loss = dist_fn(emb, per_rank[rank])
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        loss_s = ref_fn(F.normalize(ref_model(x), dim=1), full)
        loss_s.backward()
        out["loss"] = max(out["loss"], abs(float(loss.detach()) - float(loss_s.detach())))
        for g, p in zip(grads, ref_model.parameters(), strict=True):
            out["grad"] = max(out["grad"], max_diff(g, p.grad))
        if isinstance(dist_fn, RankingMemory):
            out["memory"] = max(out["memory"], max_diff(dist_fn.embeddings, ref_fn.embeddings))
            same = dist_fn.labels.shape == ref_fn.labels.shape and torch.equal(dist_fn.labels, ref_fn.labels)
            out["memory"] = max(out["memory"], 0.0 if same else 1.0)
        for m in (model, ref_model, loss_fn, ref_loss):
            m.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
                p -= 0.5 * q.grad if q.grad is not None else 0.0
    return out


def check_gather_batch_multilabel(rank: int, ws: int) -> float:
    """gather_batch(multilabel=True): label sets of different widths are padded with -1 to the widest."""
    labels = torch.full((2, 1 + rank), rank)
    batch = gather_batch(torch.zeros(2, 3), labels, multilabel=True)
    expect = torch.full((2 * ws, ws), -1)
    for r in range(ws):
        expect[2 * r : 2 * r + 2, : 1 + r] = r
    return 0.0 if torch.equal(batch.labels, expect) else 1.0


def multilabel_results(rank: int, ws: int) -> dict:
    """Every multi-label case of a ``--multilabel`` run, reduced (max) over the ranks."""
    results = {"gather_batch_multilabel": check_gather_batch_multilabel(rank, ws)}
    for name, make in multilabel_factories().items():
        plan = [("local_queries", [8] * ws), ("local_queries", [6, 10][:ws]), ("all", [6, 10][:ws])]
        plan.append(("memory", [8] * ws))
        for wrapper, sizes in plan:
            try:
                res = run_multilabel_case(make, wrapper, sizes, rank, ws)
            except Exception as err:  # reported, not hidden: the test fails on any error entry
                res = {"error": f"{type(err).__name__}: {err}"}
            vals = torch.tensor([v for k, v in sorted(res.items()) if k != "error"] or [0.0], dtype=torch.float64)
            dist.all_reduce(vals, op=dist.ReduceOp.MAX)
            if "error" not in res:
                res = dict(zip(sorted(res), vals.tolist(), strict=True))
            results[f"{name}/{wrapper}/{'-'.join(map(str, sizes))}"] = res
    return results


def _write_results(path: str, rank: int, results: dict) -> None:
    if rank == 0:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
