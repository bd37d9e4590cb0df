"""Tiered embedding tables (NumPy level; the PyTorch modules are in :mod:`tiermem.torch`).

A table's rows live directly on one device, or are *cached*: base rows on a slow
byte-addressable device, hot rows in cache pages in fast memory (thesis §5.4)::

    import tiermem
    from tiermem.embedding import EmbeddingTable
    m = tiermem.Manager({"dram": "64 MiB", "emulated:optane-pmem": "1 GiB"})
    t = EmbeddingTable(1_000_000, 64, manager=m, cache=0.25, policy="dynamic")
    out = t.lookup(indices, offsets, mode="sum")         # (bags, 64) float32
    t.update(indices, offsets, grad_out, optimizer="sgd", lr=0.01)

Bags use the ``torch.nn.EmbeddingBag`` layout: ``offsets`` has one entry per bag (the
start of each bag) or, with ``include_last_offset=True``, one more (the end). Cache policies
(thesis §5.6.1): ``dynamic`` caches rows as lookups touch them and, when the cache is full,
reclaims room second-chance style (rows hit since they were cached stay, the others leave);
``admit`` caches a row on its second recent miss; ``static`` fills the cache once (at the
first lookup, after the rows are loaded) with rows in a scrambled order and then only reads
through it; ``simple`` (``cache=None`` on a slow device) keeps every row on the slow device
without indirection.

* :mod:`.table`: :class:`EmbeddingTable` and :func:`as_bags`;
* :mod:`.collection`: :class:`EmbeddingCollection` (many tables, one kernel call);
* :mod:`.config`: :class:`OptimizerConfig`, :class:`Placement` and the vocabularies;
* :mod:`.cacheplan`: cache sizes and policies from hit-rate curves.
"""

from .collection import EmbeddingCollection
from .config import CACHE_POLICIES, DTYPES, MODES, OPTIMIZERS, PREFETCH, OptimizerConfig, Placement
from .table import EmbeddingTable, as_bags

__all__ = [
    "EmbeddingTable",
    "EmbeddingCollection",
    "as_bags",
    "OptimizerConfig",
    "Placement",
    "OPTIMIZERS",
    "CACHE_POLICIES",
    "MODES",
    "DTYPES",
    "PREFETCH",
]
