"""Control events: round trip, golden bytes (old events must stay readable), bad input."""

import pytest

from icesink.shared.errors import ProtocolError
from icesink.shared.protocol import EVENT_TYPES, decode, describe, encode
from tests.unit.event_samples import SAMPLES

# Bytes written by version 1. Never edit an entry: add new ones. A change that breaks one of
# these breaks reading control topics written by deployed workers.
GOLDEN = {
    'claim': b'{"generation":3,"member":null,"partitions":[{"partition":0,"topic":"completed-pizzas"},{"partition":1,"topic":"completed-pizzas"}],"type":"claim","v":1,"worker":"w1"}',
    'resume': b'{"epoch":2,"generation":3,"positions":[{"offset":100,"tp":{"partition":0,"topic":"completed-pizzas"}},{"offset":0,"tp":{"partition":1,"topic":"completed-pizzas"}}],"type":"resume","v":1,"worker":"w1"}',
    'start-commit': b'{"commit_id":"r1","epoch":2,"type":"start-commit","v":1}',
    'data-written': b'{"commit_id":"r1","files":[{"column_sizes":[[1,100],[2,40]],"lower_bounds":[[2,"AQAAAAAAAAA="]],"nan_value_counts":[],"null_value_counts":[[1,0],[2,0]],"partition":[19726,3],"path":"file:///wh/rpc.db/pizzas/data/r1-w1-1/date_ordered_day=2024-01-04/part-0.parquet","record_count":10,"size_bytes":2048,"spec_id":0,"split_offsets":[4],"upper_bounds":[[2,"eAAAAAAAAAA="]],"value_counts":[[1,10],[2,10]]}],"response_id":"resp-1","table":"rpc.pizzas","type":"data-written","v":1,"worker":"w1"}',
    'data-complete': b'{"commit_id":"r1","events_sent":1,"generation":3,"ranges":[{"end":110,"start":100,"tp":{"partition":0,"topic":"completed-pizzas"}},{"end":0,"start":0,"tp":{"partition":1,"topic":"completed-pizzas"}}],"response_id":"resp-1","type":"data-complete","v":1,"valid_through_ms":1700000000000,"worker":"w1"}',
    'commit-to-table': b'{"commit_id":"r1","epoch":2,"files":1,"records":10,"snapshot_id":123456789,"table":"rpc.pizzas","type":"commit-to-table","v":1,"watermark":42}',
    'commit-complete': b'{"commit_id":"r1","epoch":2,"owners":[{"generation":3,"member":null,"tp":{"partition":0,"topic":"completed-pizzas"},"worker":"w1"}],"positions":[{"offset":110,"tp":{"partition":0,"topic":"completed-pizzas"}},{"offset":0,"tp":{"partition":1,"topic":"completed-pizzas"}}],"replay_from":40,"through":42,"type":"commit-complete","v":1,"valid_through_ms":1700000000000}',
    'rewind': b'{"epoch":2,"partitions":[{"partition":1,"topic":"completed-pizzas"}],"reason":"range start of completed-pizzas[1]: expected 0, found 5","type":"rewind","v":1,"worker":"w2"}',
    'commit-request': b'{"buffered_bytes":268435456,"type":"commit-request","v":1,"worker":"w1"}',
    'schema-proposal': b'{"schema_json":"{\\"fields\\":[{\\"id\\":1,\\"name\\":\\"order_id\\",\\"required\\":false,\\"type\\":\\"string\\"},{\\"id\\":2,\\"name\\":\\"customer\\",\\"required\\":false,\\"type\\":{\\"fields\\":[{\\"id\\":3,\\"name\\":\\"vip\\",\\"required\\":false,\\"type\\":\\"boolean\\"}],\\"type\\":\\"struct\\"}}],\\"identifier-field-ids\\":[],\\"schema-id\\":0,\\"type\\":\\"struct\\"}","table":"rpc.pizzas","type":"schema-proposal","v":1,"worker":"w1"}',
    'alter-positions': b'{"positions":[{"offset":50,"tp":{"partition":0,"topic":"completed-pizzas"}},{"offset":0,"tp":{"partition":1,"topic":"completed-pizzas"}}],"reason":"PATCH /connectors/pizzas/offsets","type":"alter-positions","v":1}',
}


def test_every_event_type_has_a_sample_and_a_golden():
    assert set(SAMPLES) == set(EVENT_TYPES) == set(GOLDEN)


@pytest.mark.parametrize("tag", sorted(GOLDEN))
def test_encode_matches_golden_bytes(tag):
    assert encode(SAMPLES[tag]) == GOLDEN[tag]


@pytest.mark.parametrize("tag", sorted(GOLDEN))
def test_golden_bytes_decode_to_the_event(tag):
    assert decode(GOLDEN[tag]) == SAMPLES[tag]


@pytest.mark.parametrize("tag", sorted(GOLDEN))
def test_describe_is_one_line(tag):
    line = describe(SAMPLES[tag])
    assert "\n" not in line and line.split()[0]


def test_file_bounds_survive_as_bytes():
    ev = decode(GOLDEN["data-written"])
    assert ev.files[0].lower_bounds == ((2, b"\x01" + b"\x00" * 7),)
    assert ev.files[0].partition == (19726, 3)


def test_optional_field_missing_in_old_bytes_takes_its_default():
    old = b'{"epoch":2,"commit_id":"r1","through":5,"positions":[],"type":"commit-complete","v":1}'
    ev = decode(old)
    assert ev.replay_from is None and ev.owners == ()


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"not json", "not JSON"),
        (b"[1]", "expected a JSON object"),
        (b'{"v":3,"type":"claim"}', "version"),
        (b'{"v":1,"type":"nope"}', "type: expected one of"),
        (b'{"v":1,"type":"claim","worker":"w"}', "claim field generation: expected int >= 0, found nothing"),
    ],
)
def test_bad_events_are_refused_with_a_reason(raw, message):
    with pytest.raises(ProtocolError, match=message):
        decode(raw)


# Bytes written before a field was added (Claim.member, Owner.member) still decode.
BEFORE_MEMBER = {
    "claim": b'{"generation":3,"partitions":[{"partition":0,"topic":"completed-pizzas"},{"partition":1,"topic":"completed-pizzas"}],"type":"claim","v":1,"worker":"w1"}',
    "commit-complete": b'{"commit_id":"r1","epoch":2,"owners":[{"generation":3,"tp":{"partition":0,"topic":"completed-pizzas"},"worker":"w1"}],"positions":[{"offset":110,"tp":{"partition":0,"topic":"completed-pizzas"}},{"offset":0,"tp":{"partition":1,"topic":"completed-pizzas"}}],"replay_from":40,"through":42,"type":"commit-complete","v":1,"valid_through_ms":1700000000000}',
}


@pytest.mark.parametrize("tag", sorted(BEFORE_MEMBER))
def test_events_written_before_member_ids_decode(tag):
    assert decode(BEFORE_MEMBER[tag]) == SAMPLES[tag]


def test_a_data_written_with_deleted_keys_is_version_2_and_round_trips():
    """Mirror tables: a response's keys files travel in ``deleted_keys``, which a version-1
    reader would ignore (and commit the rows without deleting the old ones). So an event that
    has them is written as version 2, one without them keeps version 1's bytes."""
    import dataclasses
    import json

    from icesink.shared.protocol import DataWritten, FileInfo

    plain = SAMPLES["data-written"]
    assert encode(plain) == GOLDEN["data-written"]  # no deleted_keys: version 1, unchanged
    keys = FileInfo(path="s3://w/db/t/data/r1-w1-1.keys.parquet", record_count=3, size_bytes=420, spec_id=0)
    mirror = dataclasses.replace(plain, deleted_keys=(keys,))
    body = json.loads(encode(mirror))
    assert body["v"] == 2 and body["deleted_keys"][0]["record_count"] == 3
    assert decode(encode(mirror)) == mirror
    assert isinstance(decode(encode(mirror)), DataWritten)
    older_reader = json.dumps({**body, "v": 3}).encode()  # what a newer writer's event looks like to us
    with pytest.raises(ProtocolError, match="version"):
        decode(older_reader)
    bad = json.dumps({**body, "deleted_keys": [{"path": 5}]}).encode()
    with pytest.raises(ProtocolError, match=r"deleted_keys\[0\]"):
        decode(bad)
