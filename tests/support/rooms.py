"""The walk of one batch's decode through agents/convert/ and agents/formats/ (issue 41 point 7).

:func:`walk` runs a callable under ``sys.setprofile`` and records, for every Python call that
crosses from one module ("room") of those two packages into another, the room entered. From
that sequence: ``stops`` (room changes), ``returns`` (entering a room left before in the same
entry, a call from outside the two packages such as one ``decode_json``) and ``upcalls`` (a
call from a room into one listed above it in :data:`LAYERS`, the
order of the modules' own docstring: leaves first, public entry last).

Run ``python -m tests.support.rooms`` to print the figures for the representative batches.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

#: Low to high: a room may call only rooms before it.
LAYERS: tuple[str, ...] = (
    "agents.convert.outcome", "agents.convert.limits", "agents.convert.grammar", "agents.convert.columns",
    "agents.convert.arrays", "agents.convert.wrapped", "agents.convert.plan", "agents.convert.vectorised",
    "agents.convert.reference", "agents.convert.inference", "agents.convert.decoder", "agents.convert",
    "agents.formats.connect_schema", "agents.formats.envelopes", "agents.formats.extras",
    "agents.formats.record_format", "agents.formats",
)
RANK = {room: i for i, room in enumerate(LAYERS)}


@dataclass
class Walk:
    rooms: list[str] = field(default_factory=list)  # rooms entered, in order (consecutive repeats collapsed)
    entries: list[int] = field(default_factory=list)  # where in rooms each call from outside begins
    upcalls: list[tuple[str, str]] = field(default_factory=list)  # (caller, callee), callee higher

    @property
    def stops(self) -> int:
        return len(self.rooms)

    @property
    def returns(self) -> list[str]:
        seen: set[str] = set()
        out = []
        for i, room in enumerate(self.rooms):
            if i in self.entries:
                seen = set()
            if room in seen:
                out.append(room)
            seen.add(room)
        return out


def _room(frame: FrameType | None) -> str | None:
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name in RANK:
            return str(name)
        if not name.startswith(("agents.convert", "agents.formats")):
            return None
        frame = frame.f_back
    return None


def walk(run: Callable[[], Any]) -> tuple[Walk, Any]:
    """``run()``'s result and the walk it took through the rooms."""
    w = Walk()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        if callee not in RANK:
            return
        caller = _room(frame.f_back)
        if caller == callee:
            return
        if caller is not None and RANK[caller] < RANK[callee]:
            w.upcalls.append((caller, callee))
        if caller is None:
            w.entries.append(len(w.rooms))
            w.rooms.append(callee)
        elif w.rooms[-1] != callee:
            w.rooms.append(callee)

    sys.setprofile(profile)
    try:
        result = run()
    finally:
        sys.setprofile(None)
    return w, result


def _connect(schema_fields: list[dict[str, Any]], payload: dict[str, Any]) -> bytes:
    return json.dumps({"schema": {"type": "struct", "fields": schema_fields, "optional": False},
                       "payload": payload}).encode()


def batches() -> dict[str, Callable[[], Any]]:
    """The representative decodes: name -> a call that decodes one batch through the public entry."""
    from agents.convert import decode_json, infer_schema
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.schema import Schema

    from agents.formats import RecordFormat
    from icesink.shared.config import Settings, build

    tutorial = [json.dumps({"id": i, "type": "list", "ts": 1700000000000 + i, "payload": f"p{i}"}).encode()
                for i in range(50)]
    nested = [json.dumps({"id": i, "customer": {"name": f"n{i}", "zip": i}, "tags": ["a", "b"],
                          "price": "12.50", "at": "2024-01-01T00:00:00Z"}).encode() for i in range(50)]
    fields = [{"field": "id", "type": "int64", "optional": False},
              {"field": "name", "type": "string", "optional": True}]
    connect = [_connect(fields, {"id": i, "name": f"n{i}"}) for i in range(50)]
    source = {"type": "struct", "field": "source", "optional": False,
              "fields": [{"field": "table", "type": "string", "optional": False}]}
    row = {"type": "struct", "optional": True, "fields": fields}
    dbz = [_connect([{**row, "field": "before"}, {**row, "field": "after"}, source,
                     {"field": "op", "type": "string", "optional": False}],
                    {"before": None, "after": {"id": i, "name": f"n{i}"}, "source": {"table": "t"}, "op": "c"})
           for i in range(50)]

    def settings(**extra: str) -> Settings:
        return build({"topics": "t", "iceberg.tables": "db.t", **extra})

    @dataclass
    class Message:
        value: bytes
        key: bytes | None = None

    def plain(values: list[bytes]) -> Callable[[], Any]:
        return lambda: decode_json(values, infer_schema(values))

    def envelope(values: list[bytes]) -> Callable[[], Any]:
        fmt = RecordFormat(settings(**{"value.converter.schemas.enable": "true"}))
        msgs = [Message(v) for v in values]

        def run() -> Any:
            schema = fmt.table_schema(values)
            assert isinstance(schema, Schema)
            return fmt.convert(msgs, values, schema_to_pyarrow(schema))
        return run

    return {"tutorial": plain(tutorial), "nested": plain(nested), "connect": envelope(connect),
            "debezium-envelope": envelope(dbz)}


def main() -> None:
    for name, run in batches().items():
        w, result = walk(run)
        print(f"{name}: {w.stops} stops, {len(w.returns)} returns, {len(w.upcalls)} upcalls; rows={result.table.num_rows}")
        print("   ", " > ".join(r.removeprefix("agents.") for r in w.rooms))
        for caller, callee in sorted(set(w.upcalls)):
            print("    up:", caller, "->", callee)


if __name__ == "__main__":
    main()
