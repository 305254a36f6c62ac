"""A fetch read the fan-out way (agents/decode.py, BatchDecoder.decode_fanout: a topic routed to many
tables of one schema, decoded once) only when each of its tables is a known member of the
fan-out: a table neither loaded nor a member is new, and goes the usual way, which creates it.

Seen in bench/versus_reference.py (1M pizza events, 6 partitions, 200 tables round robin, so
partitions 0, 2, 4 carry only even tables and 1, 3, 5 only odd ones): once the odd tables made
a fan-out, the first fetch of an even partition was taken the fan-out way, its tables never
created, and every round's write failed with KeyError: 'bench.t000' until the replica stopped."""

from types import SimpleNamespace

import pyarrow as pa

from agents.decode import BatchDecoder, FanoutPlan
from agents.formats import RecordFormat
from agents.routing import Router
from agents.tables import Target
from icesink.shared.config import build

SCHEMA = pa.schema([("tbl", pa.string()), ("id", pa.int64())])


async def no_proposal(proposal) -> None:
    raise AssertionError(f"no schema change here: {proposal}")


def make_decoder(members: list[str]) -> BatchDecoder:
    """A decoder that saw a fan-out of ``members`` (tables of SCHEMA) in earlier fetches."""
    settings = build({"topics": "t", "iceberg.tables.dynamic-enabled": "true", "iceberg.tables.route-field": "tbl"})
    targets = {name: Target(name, None, SCHEMA) for name in members}
    d = BatchDecoder(settings, RecordFormat(settings), Router(settings), None, None, targets, no_proposal)
    d.fanout = FanoutPlan(SCHEMA, settings.timestamp_unit_of(members[0]), dict(targets))
    return d


def fetch(tables: list[str]) -> tuple[list[bytes], list[SimpleNamespace]]:
    values = [b'{"tbl": "%s", "id": %d}' % (name.encode(), i) for i, name in enumerate(tables)]
    messages = [SimpleNamespace(topic="t", partition=0, offset=i, value=v, timestamp=None, key=None, headers=())
                for i, v in enumerate(values)]
    return values, messages


def test_a_fetch_of_members_only_is_read_the_fanout_way():
    d = make_decoder(["db.t1", "db.t3"])
    out = d.decode_fanout(*fetch(["db.t1", "db.t3", "db.t1"]))
    assert out is not None
    assert sorted(out.routes.by_table) == ["db.t1", "db.t3"] and out.rows.table.num_rows == 3


def test_a_fetch_of_new_tables_only_goes_the_usual_way():
    d = make_decoder(["db.t1", "db.t3"])
    assert d.decode_fanout(*fetch(["db.t0", "db.t2", "db.t0"])) is None


def test_a_fetch_with_one_new_table_goes_the_usual_way():
    d = make_decoder(["db.t1", "db.t3"])
    assert d.decode_fanout(*fetch(["db.t1", "db.t2"])) is None
