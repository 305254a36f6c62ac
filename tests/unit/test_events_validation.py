"""Control events are validated when decoded (docs/commits.md, "the control topic is input"):
each bad field gives a ProtocolError naming the control offset, the event type and the field."""

import json

import pytest

from icesink.shared.errors import ProtocolError
from icesink.shared.protocol import MAX_EVENT_BYTES, Claim, CommitToTable, DataWritten, FileInfo, decode, encode
from tests.unit.event_samples import SAMPLES


def mutated(tag: str, path: str, value: object) -> bytes:
    """The sample of ``tag`` as JSON with the field at ``path`` (dots and [i]) set to ``value``
    (``DELETE``: removed)."""
    body = json.loads(encode(SAMPLES[tag]))
    keys = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
    node = body
    for k in keys[:-1]:
        node = node[k]
    if value is DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return json.dumps(body).encode()


DELETE = object()

BAD_FIELDS = [
    ("claim", "worker", None, "claim field worker: expected str, found null"),
    ("claim", "worker", DELETE, "claim field worker: expected str, found nothing (the field is missing)"),
    ("claim", "worker", "\ud800", "claim field worker: expected UTF-8 text, found a lone surrogate"),
    ("claim", "generation", True, "claim field generation: expected int >= 0, found true"),
    ("claim", "generation", -1, "claim field generation: expected int >= 0, found -1"),
    ("claim", "generation", 3.0, "claim field generation: expected int >= 0, found 3.0"),
    ("claim", "partitions", "x", "claim field partitions: expected a list, found 'x'"),
    ("claim", "partitions", None, "claim field partitions: expected a list, found null"),
    ("claim", "partitions[0].partition", "x", "claim field partitions[0].partition: expected int >= 0, found 'x'"),
    ("claim", "partitions[1].partition", None, "claim field partitions[1].partition: expected int >= 0, found null"),
    ("claim", "partitions[0].topic", 5, "claim field partitions[0].topic: expected str, found 5"),
    ("claim", "partitions[0]", "t-0", "claim field partitions[0]: expected an object, found 't-0'"),
    ("resume", "epoch", 1.5, "resume field epoch: expected int >= 0, found 1.5"),
    ("resume", "positions[0].offset", -1, "resume field positions[0].offset: expected int >= 0, found -1"),
    ("resume", "positions[1].tp", [], "resume field positions[1].tp: expected an object, found []"),
    ("start-commit", "commit_id", [], "start-commit field commit_id: expected str, found []"),
    ("start-commit", "epoch", "2", "start-commit field epoch: expected int >= 0, found '2'"),
    ("data-written", "files", {}, "data-written field files: expected a list, found an object"),
    ("data-written", "files[0].path", None, "data-written field files[0].path: expected str, found null"),
    ("data-written", "files[0].record_count", "10", "data-written field files[0].record_count: expected int >= 0, found '10'"),
    ("data-written", "files[0].size_bytes", -5, "data-written field files[0].size_bytes: expected int >= 0, found -5"),
    ("data-written", "files[0].spec_id", False, "data-written field files[0].spec_id: expected int >= 0, found false"),
    ("data-written", "files[0].lower_bounds[0][1]", "!!", "data-written field files[0].lower_bounds[0][1]: expected base64 text, found '!!'"),
    ("data-written", "files[0].upper_bounds[0][1]", 7, "data-written field files[0].upper_bounds[0][1]: expected base64 text, found 7"),
    ("data-written", "files[0].column_sizes[0]", [1], "data-written field files[0].column_sizes[0]: expected a list of 2 items, found [1]"),
    ("data-written", "files[0].value_counts[1][1]", "10", "data-written field files[0].value_counts[1][1]: expected int >= 0, found '10'"),
    ("data-written", "files[0].partition[0]", {"a": 1}, "data-written field files[0].partition[0]: expected a JSON scalar, found an object"),
    ("data-written", "files[0].split_offsets[0]", True, "data-written field files[0].split_offsets[0]: expected int >= 0, found true"),
    ("data-complete", "ranges[0].start", "x", "data-complete field ranges[0].start: expected int >= 0, found 'x'"),
    ("data-complete", "ranges[0].start", -1, "data-complete field ranges[0].start: expected int >= 0, found -1"),
    ("data-complete", "ranges[0].end", 50, "data-complete field ranges[0]: expected start <= end, found start 100, end 50"),
    ("data-complete", "ranges[1].tp", {"topic": "completed-pizzas", "partition": 0},
     "data-complete field ranges[1].tp: expected each partition once, found completed-pizzas[0] again"),
    ("data-complete", "events_sent", None, "data-complete field events_sent: expected int >= 0, found null"),
    ("data-complete", "valid_through_ms", "now", "data-complete field valid_through_ms: expected int >= 0 or null, found 'now'"),
    ("data-complete", "generation", 2**70 * -1, "data-complete field generation: expected int >= 0, found -1180591620717411303424"),
    ("commit-to-table", "snapshot_id", "1", "commit-to-table field snapshot_id: expected int or null, found '1'"),
    ("commit-to-table", "watermark", -2, "commit-to-table field watermark: expected int >= -1, found -2"),
    ("commit-to-table", "table", None, "commit-to-table field table: expected str, found null"),
    ("commit-to-table", "table", "t", "commit-to-table field table: expected a table name namespace.table (no empty part), found 't'"),
    ("data-written", "table", "db..t", "data-written field table: expected a table name namespace.table (no empty part), found 'db..t'"),
    ("schema-proposal", "table", " .t", "schema-proposal field table: expected a table name namespace.table (no empty part), found ' .t'"),
    ("commit-complete", "owners[0].worker", 1, "commit-complete field owners[0].worker: expected str, found 1"),
    ("commit-complete", "owners[0].generation", None, "commit-complete field owners[0].generation: expected int >= -1, found null"),
    ("commit-complete", "through", -2, "commit-complete field through: expected int >= -1, found -2"),
    ("commit-complete", "replay_from", -1, "commit-complete field replay_from: expected int >= 0 or null, found -1"),
    ("rewind", "partitions[0]", "t-0", "rewind field partitions[0]: expected an object, found 't-0'"),
    ("rewind", "reason", None, "rewind field reason: expected str, found null"),
    ("commit-request", "buffered_bytes", 1e3, "commit-request field buffered_bytes: expected int >= 0, found 1000.0"),
    ("schema-proposal", "schema_json", {}, "schema-proposal field schema_json: expected str, found an object"),
]


@pytest.mark.parametrize("tag, path, value, message", BAD_FIELDS, ids=[f"{t}:{p}" for t, p, _, _ in BAD_FIELDS])
def test_a_bad_field_is_refused_naming_offset_type_and_field(tag, path, value, message):
    with pytest.raises(ProtocolError) as info:
        decode(mutated(tag, path, value), offset=123)
    assert str(info.value) == f"control offset 123: {message}"


def test_every_sample_decodes_after_its_round_trip():
    for tag, event in SAMPLES.items():
        assert decode(encode(event), offset=1) == event, tag


def test_values_that_are_valid_at_their_limits_are_accepted():
    assert decode(mutated("commit-to-table", "snapshot_id", -5)).snapshot_id == -5  # any id
    assert decode(mutated("commit-to-table", "snapshot_id", None)).snapshot_id is None
    assert decode(mutated("commit-to-table", "watermark", -1)).watermark == -1
    assert decode(mutated("commit-complete", "through", -1)).through == -1
    assert decode(mutated("data-complete", "valid_through_ms", None)).valid_through_ms is None
    assert decode(mutated("data-written", "files[0].partition", [None, True, 1.5, "x"])).files[0].partition == (None, True, 1.5, "x")
    ev = decode(mutated("data-complete", "ranges[0].end", 100))
    assert (ev.ranges[0].start, ev.ranges[0].end) == (100, 100)


I32, I64, EPOCH = 2**31 - 1, 2**63 - 1, 2**53 - 1
TOO_LARGE = [  # (tag, path, value, the bound named): every numeric field is bounded (issue 40)
    ("claim", "generation", 2**31, I32),
    ("claim", "partitions[0].partition", 2**31, I32),
    ("resume", "epoch", 2**53, EPOCH),
    ("resume", "generation", 10**400, I32),
    ("resume", "positions[0].offset", 2**63, I64),
    ("start-commit", "epoch", 10**400, EPOCH),
    ("start-commit", "epoch", 2**63, EPOCH),
    ("data-written", "files[0].record_count", 2**63, I64),
    ("data-written", "files[0].size_bytes", 2**64, I64),
    ("data-written", "files[0].spec_id", 2**31, I32),
    ("data-written", "files[0].column_sizes[0][0]", 2**31, I32),
    ("data-written", "files[0].column_sizes[0][1]", 2**63, I64),
    ("data-written", "files[0].lower_bounds[0][0]", 2**31, I32),
    ("data-written", "files[0].split_offsets[0]", 2**63, I64),
    ("data-complete", "generation", 2**31, I32),
    ("data-complete", "ranges[0].end", 2**63, I64),
    ("data-complete", "events_sent", 2**31, I32),
    ("data-complete", "valid_through_ms", 2**63, I64),
    ("commit-to-table", "epoch", 2**53, EPOCH),
    ("commit-to-table", "snapshot_id", 2**63, I64),
    ("commit-to-table", "files", 2**63, I64),
    ("commit-to-table", "records", 10**30, I64),
    ("commit-to-table", "watermark", 2**63, I64),
    ("commit-complete", "epoch", 2**53, EPOCH),
    ("commit-complete", "through", 2**63, I64),
    ("commit-complete", "replay_from", 2**63, I64),
    ("commit-complete", "positions[0].offset", 2**63, I64),
    ("commit-complete", "owners[0].generation", 2**31, I32),
    ("commit-complete", "valid_through_ms", 2**63, I64),
    ("rewind", "epoch", 2**53, EPOCH),
    ("commit-request", "buffered_bytes", 2**63, I64),
]


@pytest.mark.parametrize("tag, path, value, bound", TOO_LARGE, ids=[f"{t}:{p}:{len(str(v))}-digits" for t, p, v, _ in TOO_LARGE])
def test_a_number_out_of_its_range_is_refused(tag, path, value, bound):
    with pytest.raises(ProtocolError) as info:
        decode(mutated(tag, path, value), offset=5)
    assert str(info.value).startswith(f"control offset 5: {tag} field {path}: expected int <= {bound}")


@pytest.mark.parametrize("tag, path, value, message", [
    ("commit-to-table", "snapshot_id", -(2**63) - 1, "expected int >= -9223372036854775808 or null"),
    ("data-written", "files[0].partition[0]", 2**63, "expected a JSON scalar (an int within 64 bits)"),
    ("data-written", "files[0].partition[1]", -(2**63) - 1, "expected a JSON scalar (an int within 64 bits)"),
])
def test_a_signed_number_out_of_64_bits_is_refused(tag, path, value, message):
    with pytest.raises(ProtocolError) as info:
        decode(mutated(tag, path, value), offset=5)
    assert str(info.value).startswith(f"control offset 5: {tag} field {path}: {message}, found")


def test_numbers_at_their_bounds_are_accepted():
    assert decode(mutated("start-commit", "epoch", EPOCH)).epoch == EPOCH
    assert decode(mutated("claim", "generation", I32)).generation == I32
    assert decode(mutated("resume", "positions[0].offset", I64)).positions[0].offset == I64
    assert decode(mutated("commit-to-table", "snapshot_id", -(2**63))).snapshot_id == -(2**63)
    assert decode(mutated("data-written", "files[0].partition[0]", -(2**63))).files[0].partition[0] == -(2**63)
    # a checkpoint taken after a consumer-group reset holds owners of generation -1 (coordinator/state.py)
    assert decode(mutated("commit-complete", "owners[0].generation", -1)).owners[0].generation == -1


def test_unknown_fields_are_ignored_for_forward_compatibility():
    assert decode(mutated("claim", "added_later", {"x": [1]})) == SAMPLES["claim"]
    assert decode(mutated("claim", "partitions[0].leader_epoch", 4)) == SAMPLES["claim"]


@pytest.mark.parametrize(
    "raw, message",
    [
        (None, "control offset 7: value: expected a JSON event, found null"),
        (b"not json", "control offset 7: expected a JSON event, found text that is not JSON"),
        (b"\xff\xfe\x00", "control offset 7: expected a JSON event, found text that is not JSON"),
        (b"[" * 100_000, "control offset 7: expected a JSON event, found text that is not JSON"),
        (b"[1]", "control offset 7: expected a JSON object, found [1]"),
        (b'{"v":3,"type":"claim"}', "control offset 7: version: expected 1..2, found 3"),
        (b'{"v":"1","type":"claim"}', "control offset 7: version: expected 1..2, found '1'"),
        (b'{"type":"claim"}', "control offset 7: version: expected 1..2, found null"),
        (b'{"v":1,"type":"nope"}', "control offset 7: type: expected one of"),
        (b'{"v":1,"type":["claim"]}', "control offset 7: type: expected one of"),
        (b'{"v":1}', "control offset 7: type: expected one of"),
    ],
)
def test_bad_envelopes_are_refused(raw, message):
    with pytest.raises(ProtocolError) as info:
        decode(raw, offset=7)
    assert str(info.value).startswith(message)


def test_an_oversized_event_is_refused_before_it_is_parsed():
    raw = b'{"v":1,"type":"commit-request","worker":"w","buffered_bytes":1,"pad":"' + b"x" * MAX_EVENT_BYTES + b'"}'
    with pytest.raises(ProtocolError, match=f"control offset 9: expected at most {MAX_EVENT_BYTES} bytes, found"):
        decode(raw, offset=9)


def test_an_event_no_reader_would_accept_is_never_encoded():
    big = FileInfo(path="x" * MAX_EVENT_BYTES, record_count=1, size_bytes=1, spec_id=0)
    with pytest.raises(ProtocolError, match=f"data-written event: expected at most {MAX_EVENT_BYTES} bytes"):
        encode(DataWritten("r", "resp", "w", "db.t", (big,)))
    assert decode(encode(CommitToTable(1, "r", "db.t", None, 0, 0, -1))).snapshot_id is None


def test_without_an_offset_the_message_says_control_event():
    with pytest.raises(ProtocolError, match="^control event: claim field worker: expected str, found null$"):
        decode(mutated("claim", "worker", None))
    assert decode(encode(Claim("w", 0, ()))) == Claim("w", 0, ())
