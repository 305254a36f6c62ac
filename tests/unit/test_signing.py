"""Signed control events (iceberg.control.secret, icesink/signing.py): readers with the secret
skip events that are unsigned, signed with another secret, or altered after signing."""

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from icesink import signing
from icesink.config import load_settings
from icesink.control import ControlReader, decode_record
from icesink.errors import ProtocolError
from icesink.protocol import StartCommit, encode
from icesink.metrics import Metrics
from tests.unit.test_control_reader import FakeConsumer, record

GROUP = "g"
SECRET = b"group secret"
KEY = GROUP.encode()
VALUE = encode(StartCommit(1, "r1"))


def signed(value: bytes = VALUE, secret: bytes = SECRET, key: bytes = KEY):
    return [(signing.HEADER, signing.sign(secret, key, value))]


def test_a_signed_event_decodes_with_the_secret_and_without_it():
    assert decode_record(KEY, VALUE, 7, GROUP, headers=signed(), secret=SECRET) == StartCommit(1, "r1")
    assert decode_record(KEY, VALUE, 7, GROUP, headers=signed()) == StartCommit(1, "r1")  # no secret: not checked


@pytest.mark.parametrize("headers, found", [
    ([], "no signature"),
    (signed(secret=b"another secret"), "a wrong signature"),
    (signed(value=encode(StartCommit(999, "r1"))), "a wrong signature"),  # the value was altered
    (signed(key=b"other-group"), "a wrong signature"),
    (signed() + signed(), "a wrong signature"),
])
def test_an_event_not_signed_with_the_secret_is_invalid(headers, found):
    with pytest.raises(ProtocolError) as err:
        decode_record(KEY, VALUE, 7, GROUP, headers=headers, secret=SECRET)
    assert str(err.value).startswith("control offset 7: signature: expected an HMAC-SHA256 under the group's "
                                     f"iceberg.control.secret, found {found}")


def test_a_reader_with_the_secret_skips_and_counts_unsigned_events(caplog):
    metrics = Metrics(CollectorRegistry())
    forged = encode(StartCommit(10**6, "forged"))

    async def go():
        reader = ControlReader("127.0.0.1:1", "c", GROUP, {}, metrics=metrics, reader="worker", secret=SECRET)
        reader._consumer = FakeConsumer([[record(0, KEY, VALUE, signed()), record(1, KEY, forged)]])
        return await reader.read(0.1)

    with caplog.at_level(logging.ERROR, logger="icesink.control"):
        assert asyncio.run(go()) == [(0, StartCommit(1, "r1"))]
    assert metrics.registry.get_sample_value("icesink_control_events_invalid_total", {"reader": "worker"}) == 1
    assert "control offset 1: signature" in caplog.text


def test_the_secret_is_a_secret_setting():
    s = load_settings(None, None, {"topics": "t", "iceberg.tables": "db.t", "iceberg.control.secret": "s3cr3t-value"})
    assert s.control_signing_key() == b"s3cr3t-value"
    assert "s3cr3t-value" not in repr(s.masked()) and "s3cr3t-value" in s.secret_values()
    assert load_settings(None, None, {"topics": "t", "iceberg.tables": "db.t"}).control_signing_key() is None
