"""Kafka Connect's ``Filter``: drops the records its predicate holds for (all of them without
one). Dropped records are never converted; their offsets count as consumed, as Connect's."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["dropped"]


def dropped(n: int, where: npt.NDArray[np.bool_] | None) -> npt.NDArray[np.bool_]:
    return np.ones(n, dtype=bool) if where is None else where
