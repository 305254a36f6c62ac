"""Fuzz of the control topic as input: random bytes and random mutations of valid encoded events
either decode to a valid event or raise ProtocolError (nothing else), and any sequence of
decoded events applied to the coordinator's state machine never raises."""

import json
from typing import Any

from hypothesis import given, settings, strategies as st

from coordinator.state import CoordinatorState, checkpoint_event
from icesink.shared.errors import ProtocolError
from icesink.shared.protocol import (
    EVENT_TYPES, Claim, CommitComplete, CommitRequest, CommitToTable, DataComplete, DataWritten, FileInfo,
    OffsetRange, Owner, Position, Resume, Rewind, SchemaProposal, StartCommit, TopicPartition, decode, encode,
)
from tests.unit.event_samples import SAMPLES

# Small alphabets, so that random events interact (same workers, partitions, rounds, responses).
workers = st.sampled_from(["w1", "w2", "w3"])
offsets = st.integers(0, 30)
small = st.integers(0, 4)
ids = st.sampled_from(["r1", "r2", "a", "b", "c"])
tps = st.builds(TopicPartition, st.sampled_from(["t", "u"]), st.integers(0, 2))
files = st.builds(FileInfo, path=st.sampled_from(["file:///wh/t/data/f1.parquet", "file:///wh/t/data/f2.parquet", "/x"]),
                  record_count=offsets, size_bytes=offsets, spec_id=small,
                  partition=st.tuples(st.none() | st.integers() | st.text(max_size=3)),
                  lower_bounds=st.lists(st.tuples(small, st.binary(max_size=8)), max_size=2).map(tuple))


@st.composite
def ranges(draw: Any) -> tuple[OffsetRange, ...]:
    parts = draw(st.lists(tps, unique=True, max_size=3))
    out = []
    for tp in parts:
        start = draw(offsets)
        out.append(OffsetRange(tp, start, start + draw(small)))
    return tuple(out)


events = st.one_of(
    st.builds(Claim, workers, small, st.lists(tps, max_size=3).map(tuple)),
    st.builds(Resume, small, workers, small, st.lists(st.builds(Position, tps, offsets), max_size=3).map(tuple)),
    st.builds(StartCommit, small, ids),
    st.builds(DataWritten, ids, ids, workers, st.sampled_from(["db.t", "db.u"]), st.lists(files, max_size=2).map(tuple)),
    st.builds(DataComplete, ids, ids, workers, small, ranges(), small, st.none() | offsets),
    st.builds(CommitToTable, small, ids, st.just("db.t"), st.none() | st.integers(), small, small, st.integers(-1, 30)),
    st.builds(CommitComplete, small, ids, st.integers(-1, 30), st.lists(st.builds(Position, tps, offsets), max_size=2).map(tuple),
              st.lists(st.builds(Owner, tps, workers, small), max_size=2).map(tuple), st.none() | offsets, st.none() | offsets),
    st.builds(Rewind, small, workers, st.lists(tps, max_size=2).map(tuple), st.text(max_size=5)),
    st.builds(CommitRequest, workers, offsets),
    st.builds(SchemaProposal, workers, st.just("db.t"), st.text(max_size=10)),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def nodes(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) of a JSON value, depth first."""
    out: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((value, k))
            out += nodes(v)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((value, i))
            out += nodes(v)
    return out


@st.composite
def mutations(draw: Any, base: st.SearchStrategy[Any] = events) -> bytes:
    """A valid encoded event, changed: one JSON node replaced or removed, a key added, or raw
    bytes flipped, cut or inserted."""
    data = encode(draw(base))
    how = draw(st.sampled_from(["replace", "remove", "add", "bytes", "none"]))
    if how == "bytes":
        raw = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(raw) - 1))
            op = draw(st.sampled_from(["flip", "cut", "insert"]))
            if op == "flip":
                raw[i] = draw(st.integers(0, 255))
            elif op == "cut":
                del raw[i:i + draw(st.integers(1, 8))]
                if not raw:
                    break
            else:
                raw[i:i] = draw(st.binary(min_size=1, max_size=4))
        return bytes(raw)
    if how == "none":
        return data
    body = json.loads(data)
    container, key = draw(st.sampled_from(nodes(body)))
    if how == "replace":
        container[key] = draw(json_values)
    elif how == "remove":
        del container[key]
    elif isinstance(container, dict):
        container[draw(st.text(max_size=4))] = draw(json_values)
    else:
        container.insert(key, draw(json_values))
    return json.dumps(body).encode()


def decoded_or_refused(data: bytes | None) -> Any:
    try:
        ev = decode(data, offset=0)
    except ProtocolError:
        return None
    assert type(ev) in EVENT_TYPES.values()
    again = encode(ev)  # a decoded event is valid: it encodes and decodes to itself
    assert encode(decode(again)) == again
    return ev


@given(st.binary(max_size=300))
def test_random_bytes_decode_or_raise_protocol_error(data):
    decoded_or_refused(data)


@settings(max_examples=300)
@given(mutations())
def test_mutated_events_decode_to_a_valid_event_or_raise_protocol_error(data):
    decoded_or_refused(data)


@given(st.sampled_from(sorted(SAMPLES)).flatmap(lambda tag: mutations(st.just(SAMPLES[tag]))))
def test_mutated_samples_decode_or_raise_protocol_error(data):
    decoded_or_refused(data)


@settings(max_examples=150)
@given(st.lists(mutations() | events.map(encode), max_size=40))
def test_any_decoded_sequence_applied_to_the_state_never_raises(log):
    state = CoordinatorState()
    for offset, data in enumerate(log):
        ev = decoded_or_refused(data)
        if ev is not None:
            state.apply(offset, ev)
            if isinstance(ev, Claim):
                state.resume_positions(ev)
    state.round_answered()
    state.take_rejected()
    state.take_orphans()
    batch, cp = state.plan_commit()
    state.committed(batch)
    checkpoint = checkpoint_event(1, "r", cp, None)
    assert decode(encode(checkpoint)) == checkpoint  # the state it checkpoints is valid input too
    recovered = CoordinatorState.from_checkpoint(checkpoint)
    for offset, data in enumerate(log):
        ev = decoded_or_refused(data)
        if ev is not None:
            recovered.apply(offset, ev, checkpoint_through=checkpoint.through)


HUGE = st.sampled_from([10**400, -(10**400), 2**64, 2**63, 2**63 - 1, -(2**63) - 1, 2**53, 2**53 - 1, 2**31, 2**31 - 1, -1])


@st.composite
def numbers_replaced(draw: Any, event: Any) -> bytes:
    """A valid event with one of its numbers (at any depth) replaced by one near or past a bound."""
    body = json.loads(encode(event))
    numeric = [(c, k) for c, k in nodes(body) if type(c[k]) is int and k != "v"]
    container, key = draw(st.sampled_from(numeric))
    container[key] = draw(HUGE)
    return json.dumps(body).encode()


def integers_in(value: Any) -> list[int]:
    if type(value) is int:
        return [value]
    if isinstance(value, tuple):
        return [n for v in value for n in integers_in(v)]
    if hasattr(value, "__dataclass_fields__"):
        return [n for name in value.__dataclass_fields__ for n in integers_in(getattr(value, name))]
    return []


@settings(max_examples=300)
@given(st.sampled_from(sorted(t for t in SAMPLES if t != "schema-proposal")).flatmap(lambda tag: numbers_replaced(SAMPLES[tag])))
def test_every_number_of_a_decoded_event_fits_a_long_a_float_and_the_next_epoch(data):
    """Issue 40: no number a reader accepts can crash it, a metric or a comparison."""
    from coordinator.state import next_epoch
    from icesink.shared.protocol.codec import INT64_MAX, INT64_MIN, MAX_EPOCH

    ev = decoded_or_refused(data)
    if ev is None:
        return
    for n in integers_in(ev):
        assert INT64_MIN <= n <= INT64_MAX
        float(n)  # what a gauge does with it
    if hasattr(ev, "epoch"):
        assert ev.epoch <= MAX_EPOCH
        assert decode(encode(StartCommit(next_epoch([ev.epoch]), "r"))).epoch <= MAX_EPOCH
