"""Kafka Connect's ``RegexRouter``: a topic that matches ``regex`` whole becomes ``replacement``
(Java's ``replaceFirst``, ``$1`` group references); other topics stay. Applied to the distinct
topics of a batch (a dictionary), not per record; the new topic feeds routing by topic."""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from icesink.shared.transform_settings import TransformSpec, java_replacement

__all__ = ["RegexRouter"]


class RegexRouter:
    def __init__(self, spec: TransformSpec) -> None:
        self.regex = re.compile(spec.props["regex"])
        self.replacement = java_replacement(spec.props["replacement"])

    def rename(self, topic: str) -> str:
        m = self.regex.fullmatch(topic)
        return topic if m is None else m.expand(self.replacement)

    def apply(self, topics: pa.DictionaryArray, where: npt.NDArray[np.bool_] | None) -> pa.DictionaryArray:
        renamed = pa.array([self.rename(t) for t in topics.dictionary.to_pylist()], pa.string())
        new = pa.DictionaryArray.from_arrays(topics.indices, renamed)
        if where is None:
            return new
        mixed = pc.if_else(pa.array(where), new.dictionary_decode(), topics.dictionary_decode())
        return mixed.dictionary_encode()
