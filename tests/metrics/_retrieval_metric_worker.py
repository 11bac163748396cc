"""Worker of tests/metrics/test_retrieval_metric.py: one gloo process of a 2-process run (started by the test).

Each rank feeds its shard of a fixed global dataset to ``RetrievalMetric`` in uneven batches (rank 1 also gets
nothing in one scenario), then calls ``RetrievalEvaluator.evaluate(..., distributed=True)`` on the whole data (its
own gallery, a separate gallery, queries in the gallery, multi-label sets, fewer queries than processes) while the
rows given to the ranking kernel are counted (the kernel itself runs). Each rank writes its results as JSON to
``--out`` with ``.rank{r}`` appended.

Usage: ``python _retrieval_metric_worker.py --out f.json --rank r --world-size 2 --port p``
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

from pml_suprank.metrics import RetrievalEvaluator, RetrievalMetric
from pml_suprank.metrics import evaluator as evaluator_module


def split_cases(emb, labels):
    """``{name: (evaluator kwargs, evaluate args, evaluate kwargs)}`` of the query-split checks."""
    fine = labels[:, 0]
    sets = torch.stack([fine, torch.where(fine % 2 == 0, (fine + 1) % 6, -1)], 1)  # multi-label, -1 padded
    return {
        "self": ({}, (emb, labels), {}),
        "gallery": ({}, (emb[:15], labels[:15], emb[15:], labels[15:]), {}),
        "queries_in_gallery": ({}, (emb[:15], labels[:15], emb, labels), {"ref_includes_query": True}),
        "fine_only": ({}, (emb, fine), {}),
        "multilabel": ({"multilabel": True}, (emb, sets), {}),
        "one_query": ({}, (emb[:1], labels[:1], emb, labels), {}),
    }


def global_data():
    """40 items, 2 label levels, ties included (entries in {-1, 0, 1}); shards: rank 0 rows 0-22, rank 1 rows 23-39."""
    g = torch.Generator().manual_seed(7)
    emb = torch.randint(-1, 2, (40, 5), generator=g).double()
    fine = torch.randint(0, 6, (40,), generator=g)
    return emb, torch.stack([fine, fine // 3], 1)


SHARDS = {0: (0, 23), 1: (23, 40)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=args.world_size
    )
    emb, labels = global_data()
    s, e = SHARDS[args.rank]
    results = {}

    metric = RetrievalMetric(k_values=(1, 4))
    for b in range(s, e, 6):  # uneven batches
        metric.update(emb[b : min(b + 6, e)], labels[b : min(b + 6, e)])
    results["plain"] = metric.compute()
    results["local_items"] = len(metric)

    # padded sharding: rank 1 also receives copies of items 0 and 1 (what a DistributedSampler adds), with indices
    metric.reset()
    idx = torch.arange(s, e) if args.rank == 0 else torch.cat([torch.arange(s, e), torch.tensor([0, 1])])
    metric.update(emb[idx], labels[idx], indices=idx)
    results["padded"] = metric.compute()

    # rank 1 without data
    metric.reset()
    if args.rank == 0:
        metric.update(emb[:30], labels[:30])
    results["one_empty"] = metric.compute()

    # not synced: the local shard only
    local = RetrievalMetric(k_values=(1, 4), sync=False)
    local.update(emb[s:e], labels[s:e])
    results["local"] = local.compute()
    # the query split of the evaluator: the rows this process ranks are counted around the (real) kernel
    ranked = []
    kernel = evaluator_module.chunk_ranks

    def counted(scores, *rest):
        ranked.append(int(scores.shape[0]))
        return kernel(scores, *rest)

    evaluator_module.chunk_ranks = counted
    split, rows = {}, {}
    for name, (init, call, kwargs) in split_cases(emb, labels).items():
        ranked.clear()
        out = RetrievalEvaluator(k_values=(1, 4), **init).evaluate(*call, distributed=True, return_per_query=True,
                                                                   **kwargs)  # fmt: skip
        per_query = out.pop("per_query")
        split[name] = {"summary": {m: float(x) for m, x in out.items()},
                       "per_query": {m: v.tolist() for m, v in per_query.items()}}  # fmt: skip
        rows[name] = sum(ranked)
    evaluator_module.chunk_ranks = kernel
    # bad input under the split: the one-process error on every rank (not an IndexError while reordering)
    try:
        RetrievalEvaluator().evaluate(emb, labels, emb[:10], labels[:10], ref_includes_query=True, distributed=True)
        refused = ""
    except ValueError as err:
        refused = str(err)
    # the search's query split
    from pml_suprank.search import RetrievalIndex

    scores, indices = RetrievalIndex(emb.float()).search(emb.float(), 5, distributed=True)
    split["search"] = {"scores": scores.tolist(), "indices": indices.tolist()}
    plain = {k: v if isinstance(v, int) else {m: float(x) for m, x in v.items()} for k, v in results.items()}
    with open(f"{args.out}.rank{args.rank}", "w") as f:
        json.dump({**plain, "split": split, "ranked_rows": rows, "refused": refused}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
