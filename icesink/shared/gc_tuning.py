"""The cyclic garbage collector's settings in a replica process. Leaf module: no I/O.

A fetch hands the ingest agent tens of thousands of records at once: aiokafka builds a
``ConsumerRecord`` per record, and each is a container the collector tracks. With Python's
default young-generation threshold (700 allocations) a fetch's records were scanned again and
again while they lived, promoted to the old generations, and every few fetches a full collection
walked the whole heap (pyspark, pyiceberg, Faust and their modules). Over a backlog that was
a large share of a worker's Python CPU (see bench/README.md, ingest_bench --profile). Those
records die by reference counting, together, once their fetch is converted: collecting them
finds nothing.

:func:`tune` raises the young threshold above a fetch's records, so they are freed before a
collection sees them; reference cycles are still collected, every ``YOUNG_THRESHOLD`` net
allocations of tracked objects. It also turns the collector off for start-up: the imports,
catalogs and Faust's app (some 180k tracked objects) live as long as the process, and each young
collection over them found about 10 objects of garbage while it held the GIL before the first
record (0.1-0.3 s of a replica's start; bench/README.md, "Start-up without the collector's
passes"). That stretch is bounded: the catalog is tried once, the group's secret until a
deadline. :func:`freeze_start_up` moves what start-up allocated to the permanent generation,
which collections skip, and turns the collector on: called before the first record is read, and
again once the Spark session is up. It collects nothing first (the full collection it ran found
those 10 objects, for 0.1-0.3 s of the backlog's read): start-up's few objects of cyclic garbage
stay. ``python_gc_collections_total`` on /metrics counts the collections per generation.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "freeze_start_up", "tune"]

# Net allocations of tracked objects between young collections: above the ConsumerRecords alive
# at once (a fetch holds at most consumer.max-batch, 10,000 by default; two wait for the ingest
# agent while one is converted). At worst as many objects of cyclic garbage wait for a collection.
YOUNG_THRESHOLD = 100_000


def tune() -> None:
    """Raise the young generation's threshold to :data:`YOUNG_THRESHOLD` (the older generations'
    stay as they are) and turn the collector off until :func:`freeze_start_up`. Call once, early
    in the process."""
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, young), older, oldest)
    gc.disable()


def freeze_start_up() -> None:
    """Move every tracked object to the permanent generation (``gc.freeze``, which also zeroes
    the young generation's count), so that later collections skip the start-up heap, and turn
    the collector on. Call before the first record is read, and again when start-up is done."""
    gc.freeze()
    gc.enable()
