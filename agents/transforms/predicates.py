"""Kafka Connect's predicates (``org.apache.kafka.connect.transforms.predicates``), over a batch.

Each gives a boolean mask over the batch's records: ``TopicNameMatches`` (``pattern`` matches
the whole topic, as Java's ``Matcher.matches``: one test per distinct topic), ``HasHeaderKey``
(a header named ``name``), ``RecordIsTombstone`` (a null value).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from icesink.shared.transform_settings import PredicateSpec

__all__ = ["mask_of"]


def mask_of(spec: PredicateSpec, messages: Sequence[Any], topics: pa.DictionaryArray) -> npt.NDArray[np.bool_]:
    """Where ``spec`` holds, per record (``topics``: each record's current topic)."""
    if spec.kind == "topic-name-matches":
        pattern = re.compile(spec.props["pattern"])
        hits = np.array([pattern.fullmatch(t) is not None for t in topics.dictionary.to_pylist()], dtype=bool)
        codes = topics.indices.to_numpy(zero_copy_only=False)
        return hits[codes] if len(hits) else np.zeros(len(messages), dtype=bool)
    if spec.kind == "has-header-key":
        name = spec.props["name"]
        return np.fromiter((_has(m.headers, name) for m in messages), dtype=bool, count=len(messages))
    if spec.kind == "record-is-tombstone":
        return np.fromiter((m.value is None for m in messages), dtype=bool, count=len(messages))
    raise AssertionError(spec.kind)  # parse_chain admits no other kind


def _has(headers: Any, name: str) -> bool:
    if not headers:
        return False
    items = headers.items() if isinstance(headers, Mapping) else headers
    return any((k.decode("utf-8", "replace") if isinstance(k, bytes) else k) == name for k, _ in items)
