"""Search a gallery with new queries and look at the results: :class:`RetrievalIndex` (exact ``"torch"`` or faiss
backends, ``add``, ``save`` / ``load``), embedding with a model (:mod:`.from_model`) and the HTML / PNG report
(:mod:`.report`).

Example:
    >>> from pml_suprank.search import RetrievalIndex
    >>> index = RetrievalIndex(gallery_embeddings, labels=gallery_labels)
    >>> scores, indices = index.search(query_embeddings, k=10)
"""

from __future__ import annotations

from .faiss_backends import BACKENDS
from .index import RetrievalIndex

__all__ = ["BACKENDS", "RetrievalIndex"]
