"""Search a gallery with new queries and look at the results.

* :mod:`.index`: :class:`RetrievalIndex` — embeddings (+ labels, ids) searched by inner product, exact ``"torch"``
  (default) or faiss backends (``"faiss"``, ``"faiss-ivf"``, ``"faiss-hnsw"``), ``add``, ``save`` / ``load``;
* :mod:`.topk`: the exact chunked top-k with the lower-index tie rule;
* :mod:`.faiss_backends`: the faiss indexes (faiss imported only when used);
* :mod:`.options`: the backend names and which backend each option configures;
* :mod:`.storage`: the validated safetensors + JSON folder format;
* :mod:`.from_model`: embed a dataset / images with a model (``RetrievalModel.build_index`` / ``.search``);
* :mod:`.report`: an offline HTML page and a PNG grid of the results (``recipes/search.py``).

Example:
    >>> from pml_suprank.search import RetrievalIndex
    >>> index = RetrievalIndex(gallery_embeddings, labels=gallery_labels)
    >>> scores, indices = index.search(query_embeddings, k=10)
"""

from __future__ import annotations

from .index import RetrievalIndex
from .options import BACKENDS

__all__ = ["BACKENDS", "RetrievalIndex"]
