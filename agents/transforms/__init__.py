"""Single message transforms as Kafka Connect chains them (``transforms=a,b``), on a batch.

The settings side (class names, properties, checks at start) is
:mod:`icesink.shared.transform_settings`. Here the chain runs over one partition's batch,
column-wise: each record's topic is a dictionary array (one entry per distinct topic, so
``TopicNameMatches`` and ``RegexRouter`` work per distinct topic), predicates give boolean
masks, ``Filter`` adds to the mask of dropped records. What the chain decides feeds
:mod:`agents.deadletter`'s screening (dropped records) and :mod:`agents.routing` (the topic).

The transforms that change values act where the values are decoded: ``KafkaMetadataTransform``
adds the metadata columns of :mod:`agents.formats.extras`, ``DebeziumTransform`` is
:mod:`agents.debezium`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agents.transforms.filter import dropped
from agents.transforms.predicates import mask_of
from agents.transforms.regex_router import RegexRouter
from icesink.shared.transform_settings import TransformSpec

__all__ = ["Chain", "Applied"]


@dataclass(frozen=True)
class Applied:
    """A batch after the chain: each record's topic, and which records were dropped (None: none)."""

    topics: pa.DictionaryArray
    dropped: npt.NDArray[np.bool_] | None

    def topic(self) -> str | None:
        """The one topic of the batch's records, or None when they differ (or there are none)."""
        d = self.topics.dictionary
        return str(d[0]) if len(d) == 1 else None


class Chain:
    """The batch-level steps of the configured transforms, in order."""

    def __init__(self, specs: Sequence[TransformSpec]) -> None:
        self.specs = [s for s in specs if s.kind in ("filter", "regex-router")]
        self.routers = {s.name: RegexRouter(s) for s in self.specs if s.kind == "regex-router"}

    def __bool__(self) -> bool:
        return bool(self.specs)

    def apply(self, topic: str, messages: Sequence[Any]) -> Applied:
        n = len(messages)
        topics = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([topic]))
        gone: npt.NDArray[np.bool_] | None = None
        for spec in self.specs:
            where: npt.NDArray[np.bool_] | None = None
            if spec.predicate is not None:
                where = mask_of(spec.predicate, messages, topics)
                if spec.negate:
                    where = ~where
                if gone is not None:  # a dropped record goes through no further step
                    where = where & ~gone
            elif gone is not None:
                where = ~gone
            if spec.kind == "filter":
                drop = dropped(n, where)
                gone = drop if gone is None else gone | drop
            else:
                topics = self.routers[spec.name].apply(topics, where)
        return Applied(topics, gone)
