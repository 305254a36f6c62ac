"""Tuning of the bulk reader: when a run is too short for pyarrow, when failures are dense, the
block size. Read as module attributes (``limits.SMALL_RUN``) where they apply, so that tests can
set them.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa


#: At most this many records go straight to the reference path instead of another bulk read
#: (a pyarrow read has a fixed overhead that a short run does not repay; see bench/README.md,
#: convert_bench).
SMALL_RUN: Final = 16


#: After this many failures in a row within ``DENSE_GAP`` records of each other, the next
#: ``DENSE_WINDOW`` records go to the reference path (pathological batches stay O(n)).
DENSE_LIMIT: Final = 3


DENSE_GAP: Final = 16


DENSE_WINDOW: Final = 256


MAX_SINGLE_BLOCK: Final = 2**31 - 2


#: The block a threaded read parses at a time (pyarrow's default). Inferring, pyarrow types
#: each block from that block alone and cannot carry a field that was null all through one
#: block into a later block where it is an object or an array (ArrowNotImplementedError "JSON
#: conversion to struct<...> is not supported"): an inferring read that fails so is read again
#: as one block (see :data:`INFER_FAILURES`). Tests make it small to cross blocks in small batches.
BLOCK_SIZE: Final = 1 << 20


#: What a failed inferring read raises: both send the scan to its fallbacks (one block, then
#: splitting at the row named or bisecting), never out of decode_json. A read against an
#: explicit schema fails only with ArrowInvalid; anything else there is a bug in the parse schema.
INFER_FAILURES: Final = (pa.ArrowInvalid, pa.ArrowNotImplementedError)
