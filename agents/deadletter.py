"""Records that cannot be converted: counted, logged with where they came from, and kept.

Until the dead-letter topic lands (errors.deadletterqueue.topic.name), rejected records are
appended to JSON-lines files under ``<state.dir>/deadletter/`` with the original key and
value bytes (base64), the error, the field, and the source topic, partition and offset.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any, Sequence

from agents.convert import Reject
from icesink.errors import DataError
from icesink.events import TopicPartition
from icesink.metrics import Metrics

log = logging.getLogger(__name__)


class DeadLetters:
    def __init__(self, directory: Path, metrics: Metrics) -> None:
        self.directory = directory
        self.metrics = metrics

    def write(self, tp: TopicPartition, messages: Sequence[Any], rejects: Sequence[Reject], *, table: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{tp.topic}.jsonl"
        with path.open("a", encoding="utf-8") as out:
            for r in rejects:
                m = messages[r.index]
                err = DataError(r.reason, topic=tp.topic, partition=tp.partition, offset=m.offset, field=r.field)
                log.error("record rejected for table %s: %s", table, err)
                self.metrics.records_rejected.labels(topic=tp.topic, reason=r.reason.split(":")[0][:40]).inc()
                out.write(json.dumps({
                    "table": table, "topic": tp.topic, "partition": tp.partition, "offset": m.offset,
                    "error": r.reason, "field": r.field,
                    "key": base64.b64encode(m.key).decode() if m.key is not None else None,
                    "value": base64.b64encode(m.value).decode() if m.value is not None else None,
                }) + "\n")
