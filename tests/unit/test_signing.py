"""Signed control events (iceberg.control.secret, icesink/shared/signing.py): readers with the secret
skip events that are unsigned, signed with another secret, or altered after signing."""

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from icesink.shared import signing
from icesink.shared.config import load_settings
from icesink.shared.control import ControlReader, decode_record
from icesink.shared.errors import ProtocolError
from icesink.shared.protocol import StartCommit, encode
from icesink.shared.metrics import Metrics
from tests.unit.test_control_reader import FakeConsumer, record

GROUP = "g"
SECRET = b"group secret"
KEY = GROUP.encode()
VALUE = encode(StartCommit(1, "r1"))


@pytest.fixture(autouse=True)
def forget_learned_secrets(monkeypatch):
    """Secrets learned here (icesink.shared.secrets.learn_secret) are the process's: undone after each test."""
    import icesink.shared.secrets

    monkeypatch.setattr(icesink.shared.secrets, "_learned", ())


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
    assert str(err.value).startswith("control offset 7: signature: expected an HMAC-SHA256 under the group's secret "
                                     f"(iceberg.control.secret, or the group's own in the catalog), found {found}")


def test_a_reader_with_the_secret_skips_and_counts_unsigned_events(caplog):
    metrics = Metrics(CollectorRegistry())
    forged = encode(StartCommit(10**6, "forged"))

    async def go():
        reader = ControlReader("127.0.0.1:1", "c", GROUP, {}, metrics=metrics, reader="worker", secret=SECRET)
        reader._consumer = FakeConsumer([[record(0, KEY, VALUE, signed()), record(1, KEY, forged)]])
        return await reader.read(0.1)

    with caplog.at_level(logging.ERROR, logger="icesink.shared.control"):
        assert asyncio.run(go()) == [(0, StartCommit(1, "r1"))]
    assert metrics.registry.get_sample_value("icesink_control_events_invalid_total", {"reader": "worker"}) == 1
    assert "control offset 1: signature" in caplog.text


def test_the_secret_is_a_secret_setting():
    s = load_settings(None, None, {"topics": "t", "iceberg.tables": "db.t", "iceberg.control.secret": "s3cr3t-value"})
    assert s.control_signing_key() == b"s3cr3t-value"
    assert "s3cr3t-value" not in repr(s.masked()) and "s3cr3t-value" in s.secret_values()
    assert load_settings(None, None, {"topics": "t", "iceberg.tables": "db.t"}).control_signing_key() is None


# The group's own secret (issue 40): signed by default, kept in the catalog ---------------------


def test_unsigned_events_below_where_signing_began_are_the_groups_and_accepted():
    """An upgrade: the log holds the group's unsigned events from before it signed. Below the
    recorded offset they are accepted (nobody can write there any more); at it and above, not."""
    refused = []
    ring = signing.Keyring(SECRET, unsigned_below=10, on_refused=lambda: refused.append(1))
    assert decode_record(KEY, VALUE, 9, GROUP, secret=ring) == StartCommit(1, "r1")
    assert decode_record(KEY, VALUE, 9, GROUP, headers=signed(), secret=ring) == StartCommit(1, "r1")
    with pytest.raises(ProtocolError, match="control offset 9: signature: .* found a wrong signature"):
        decode_record(KEY, VALUE, 9, GROUP, headers=signed(secret=b"other"), secret=ring)
    with pytest.raises(ProtocolError, match="control offset 10: signature: .* found no signature"):
        decode_record(KEY, VALUE, 10, GROUP, secret=ring)
    assert decode_record(b"other-group", VALUE, 11, GROUP, secret=ring) is None  # not ours: not judged
    assert len(refused) == 2


def test_a_keyring_not_loaded_yet_trusts_and_signs_nothing():
    ring = signing.Keyring()
    with pytest.raises(ProtocolError, match="not loaded"):
        decode_record(KEY, VALUE, 0, GROUP, headers=signed(), secret=ring)
    with pytest.raises(RuntimeError):
        ring.sign(KEY, VALUE)
    ring.load(SECRET, 3)
    assert ring.sign(KEY, VALUE) == signed()[0][1] and ring.unsigned_below == 3


def sqlite_catalog(directory):
    from icesink.shared.catalogs import sqlite_catalog_properties
    from pyiceberg.catalog import load_catalog

    return load_catalog("it", **sqlite_catalog_properties(directory))


def _provision_in_a_process(directory: str, group: str, start) -> tuple[str, int, bool]:
    from icesink.shared import group_secret

    catalog = sqlite_catalog(directory)
    start.wait()
    stored, made = group_secret.provision(catalog, "icesink", group, "log-1", 42)
    return stored.key, stored.signed_from, made


def test_replicas_of_a_new_group_starting_at_once_converge_on_one_secret(tmp_path):
    """Four processes released at once on a new group (and a new namespace) of a real SQLite
    catalog: one stores its secret, all four come back with it."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    sqlite_catalog(tmp_path)  # the catalog's tables exist (as after any replica's first start)
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager:
        start = manager.Barrier(4)
        with ProcessPoolExecutor(4, mp_context=ctx) as pool:
            results = list(pool.map(_provision_in_a_process, [str(tmp_path)] * 4, ["race"] * 4, [start] * 4))
    assert len({(k, f) for k, f, _ in results}) == 1, results
    assert sum(made for _, _, made in results) == 1
    key, start_offset, _ = results[0]
    assert len(key) == 64 and start_offset == 42


def test_a_second_group_in_the_same_namespace_gets_its_own_secret(tmp_path):
    from icesink.shared import group_secret

    catalog = sqlite_catalog(tmp_path)
    a, made_a = group_secret.provision(catalog, "icesink", "a", None, 0)
    b, made_b = group_secret.provision(catalog, "icesink", "b", None, 5)
    again, made_again = group_secret.provision(catalog, "icesink", "a", None, 99)
    assert made_a and made_b and not made_again
    assert a.key != b.key and again == a  # kept: the later log end changes nothing
    props = catalog.load_namespace_properties("icesink")
    assert set(props) >= {"icesink.control-secret.a", "icesink.control-secret.b"}
    assert group_secret.read_secret(catalog, "icesink", "c") is None
    assert group_secret.read_secret(catalog, "nowhere", "a") is None


class DictCatalog:
    """A catalog with namespace properties and no atomic write (REST, Glue, Hive as icesink sees
    them): update_namespace_properties replaces, the last writer wins."""

    def __init__(self):
        self.namespaces: dict[str, dict[str, str]] = {}

    def load_namespace_properties(self, ns):
        from pyiceberg.exceptions import NoSuchNamespaceError

        if ns not in self.namespaces:
            raise NoSuchNamespaceError(ns)
        return dict(self.namespaces[ns])

    def create_namespace(self, ns, props):
        from pyiceberg.exceptions import NamespaceAlreadyExistsError

        if ns in self.namespaces:
            raise NamespaceAlreadyExistsError(ns)
        self.namespaces[ns] = dict(props)

    def update_namespace_properties(self, ns, removals=None, updates=()):
        self.namespaces[ns].update(updates)


def test_without_an_atomic_write_racing_replicas_read_back_after_the_settle_time():
    """Both find no secret, both write (the second replaces the first), and only then read back:
    both use the stored one."""
    import threading

    from icesink.shared import group_secret

    both_read, both_wrote = threading.Barrier(2), threading.Barrier(2)

    class Racing(DictCatalog):
        reads = 0

        def load_namespace_properties(self, ns):
            props = super().load_namespace_properties(ns)
            self.reads += 1
            if self.reads <= 2:  # each replica's first read: neither has written yet
                both_read.wait(5)
            return props

    catalog = Racing()
    catalog.create_namespace("icesink", {})
    out = []

    def replica():
        out.append(group_secret.provision(catalog, "icesink", "g", None, 7, sleep=lambda _s: both_wrote.wait(5)))

    threads = [threading.Thread(target=replica) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a, made_a), (b, made_b) = out
    assert a == b and made_a != made_b


def test_a_stored_value_that_is_not_a_secret_is_refused_without_quoting_it():
    from icesink.shared import group_secret
    from icesink.shared.errors import ControlSecretError

    catalog = DictCatalog()
    catalog.create_namespace("icesink", {"icesink.control-secret.g": '{"v":1,"key":"short-and-secret","from":0}'})
    with pytest.raises(ControlSecretError) as err:
        group_secret.provision(catalog, "icesink", "g", None, 0)
    assert "namespace icesink property icesink.control-secret.g" in str(err.value)
    assert "short-and-secret" not in str(err.value)


def test_a_long_group_id_gets_a_property_key_a_sql_catalog_can_hold():
    from icesink.shared.group_secret import property_key

    assert property_key("g") == "icesink.control-secret.g"
    assert len(property_key("x" * 400)) <= 255 and property_key("x" * 400) != property_key("y" * 400)


def loader(tmp_path, **extra):
    from icesink.shared.group_secret import SecretLoader

    s = load_settings(None, None, {"topics": "t", "iceberg.tables": "db.t", "group.id": "g", **extra})
    ring = signing.Keyring()
    return SecretLoader(s, "127.0.0.1:1", ring, Metrics(CollectorRegistry())), ring


class InlineOffload:
    async def run(self, fn, *a, **kw):
        return fn(*a, **kw)


def test_the_configured_secret_wins_and_the_catalog_is_not_read(tmp_path):
    secret, ring = loader(tmp_path, **{"iceberg.control.secret": "configured-secret"})
    asyncio.run(secret.load(None, InlineOffload()))  # no catalog: it must not be touched
    assert ring.key == b"configured-secret" and ring.unsigned_below == 0


def test_a_replica_whose_events_are_refused_reads_the_secret_again_and_takes_the_stored_one(tmp_path, caplog):
    """The race a catalog without an atomic write leaves open: this replica holds a secret that
    another replica's write replaced. Events of its group fail its check: it reads the stored
    secret again (at most every RELOAD_S), takes it, says so and counts it."""
    from icesink.shared import group_secret

    catalog = sqlite_catalog(tmp_path)
    stored, _ = group_secret.provision(catalog, "icesink", "g", None, 0)
    secret, ring = loader(tmp_path)
    ring.load(b"0" * 64)  # the lost race
    asyncio.run(secret.maybe_reload(catalog, InlineOffload()))
    assert ring.key == b"0" * 64  # nothing refused yet: nothing read
    with pytest.raises(ProtocolError):
        decode_record(KEY, VALUE, 5, GROUP, headers=signed(secret=stored.key.encode()), secret=ring)
    with caplog.at_level(logging.WARNING, logger="icesink.shared.group_secret"):
        asyncio.run(secret.maybe_reload(catalog, InlineOffload()))
    assert ring.key == stored.key.encode()
    assert secret.metrics.registry.get_sample_value("icesink_control_secret_reloads_total") == 1
    assert "is not the one this replica signed with" in caplog.text and stored.key not in caplog.text
    assert decode_record(KEY, VALUE, 6, GROUP, headers=signed(secret=stored.key.encode()), secret=ring) == StartCommit(1, "r1")


def test_a_learned_secret_is_masked_by_every_redactor_even_one_made_before(caplog):
    from icesink.shared.secrets import MASK, Redactor, RedactingFilter, learn_secret

    before = Redactor([])
    value = "4f" * 32
    assert before(f"key {value}") == f"key {value}"
    learn_secret(value)
    assert before(f"key {value}") == f"key {MASK}" and Redactor([])(value) == MASK
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "secret %s", (value,), None)
    RedactingFilter(before).filter(record)
    assert value not in record.getMessage()


def test_the_secret_namespace_setting_has_a_default_and_refuses_an_empty_one():
    from icesink.shared.errors import ConfigError

    base = {"topics": "t", "iceberg.tables": "db.t"}
    assert load_settings(None, None, base).control_secret_namespace == "icesink"
    assert load_settings(None, None, {**base, "iceberg.control.secret-namespace": "db"}).control_secret_namespace == "db"
    with pytest.raises(ConfigError, match="iceberg.control.secret-namespace"):
        load_settings(None, None, {**base, "iceberg.control.secret-namespace": ""})


def test_a_catalog_that_refuses_the_property_stops_the_start_naming_what_to_set(tmp_path, monkeypatch):
    from pyiceberg.exceptions import ForbiddenError

    from icesink.shared import group_secret
    from icesink.shared.errors import ControlSecretError

    async def topic_id(*_a, **_kw):
        return "log-1"

    async def end_offsets(*_a, **_kw):
        return {0: 12}

    monkeypatch.setattr(group_secret, "topic_id", topic_id)
    monkeypatch.setattr(group_secret, "end_offsets", end_offsets)

    class Refusing(DictCatalog):
        def load_namespace_properties(self, ns):
            raise ForbiddenError("not allowed to read namespace icesink")

    secret, ring = loader(tmp_path)
    with pytest.raises(ControlSecretError) as err:
        asyncio.run(secret.load(Refusing(), InlineOffload()))
    message = str(err.value)
    assert "namespace icesink, property icesink.control-secret.g" in message and "not allowed" in message
    assert "iceberg.control.secret-namespace" in message and "set iceberg.control.secret" in message
    assert not ring.loaded

    catalog = DictCatalog()
    asyncio.run(secret.load(catalog, InlineOffload()))  # a catalog that allows it: made, and loaded
    stored = group_secret.read_secret(catalog, "icesink", "g")
    assert ring.key == stored.key.encode() and ring.unsigned_below == 0 and stored.log_id == "log-1"  # a new group


def _fake_log(monkeypatch, end):
    from icesink.shared import group_secret

    async def topic_id(*_a, **_kw):
        return "log-1"

    async def end_offsets(*_a, **_kw):
        return {0: end}

    monkeypatch.setattr(group_secret, "topic_id", topic_id)
    monkeypatch.setattr(group_secret, "end_offsets", end_offsets)


@pytest.mark.parametrize("ran, below", [(False, 0), (True, 12)])
def test_signing_starts_at_0_for_a_new_group_and_at_the_log_end_only_for_one_that_ran(tmp_path, monkeypatch, ran, below):
    """An outsider's unsigned events written before a new group's first start (offsets 0..11)
    are not the group's: trusted only if the group ran before (an upgrade)."""
    _fake_log(monkeypatch, 12)

    async def has_run():
        return ran

    secret, ring = loader(tmp_path)
    # a replica that cannot tell (no has_run) takes the group as new
    asyncio.run(secret.load(DictCatalog(), InlineOffload(), *([has_run] if ran else [])))
    assert ring.unsigned_below == below
    forged = lambda: decode_record(KEY, VALUE, 3, GROUP, secret=ring)  # noqa: E731
    if ran:
        assert forged() == StartCommit(1, "r1")
    else:
        with pytest.raises(ProtocolError, match="no signature"):
            forged()


class LogConsumer:
    """An aiokafka consumer over a fixed control log, with a committed offset."""

    def __init__(self, records, committed):
        self.records, self._committed, self.at = records, committed, 0

    async def committed(self, tp):
        return self._committed

    def seek(self, tp, offset):
        self.at = offset

    async def seek_to_beginning(self, tp):
        self.at = 0

    async def position(self, tp):
        return self.at

    async def getmany(self, tp, timeout_ms, max_records):
        out = [r for r in self.records if r.offset >= self.at]
        self.at = self.records[-1].offset + 1
        return {tp: out} if out else {}


def test_a_refused_checkpoint_is_no_base_and_no_older_one_is_taken_instead(caplog):
    """An outsider's CommitComplete that the coordinator group's offset points to is refused
    (unsigned): no checkpoint, so the coordinator recovers from the tables' state (the truth of
    what was committed). Not from an older CommitComplete below it: after a secret change the
    only ones found valid are unsigned ones (from before signing began, or an outsider's), whose
    positions are stale or chosen by the outsider (duplicates or skipped records)."""
    from types import SimpleNamespace

    from coordinator.session import Session
    from coordinator.startup import Recovery
    from icesink.shared.config import build
    from icesink.shared.protocol import CommitComplete, encode

    def rec(offset, event, secret=SECRET):
        value = encode(event)
        return SimpleNamespace(offset=offset, key=KEY, value=value,
                               headers=signed(value, secret) if secret else ())

    real = CommitComplete(1, "r1", 0, (), replay_from=0)
    forged = CommitComplete(10**6, "forged", 2, (), replay_from=2)
    records = [rec(0, real), rec(1, StartCommit(2, "r2")), rec(2, forged, secret=None), rec(3, StartCommit(2, "r3"))]

    async def recover():
        reader = ControlReader("127.0.0.1:1", "c", GROUP, {}, reader="coordinator", secret=SECRET)
        reader._consumer = LogConsumer(records, committed=2)
        settings = build({"topics": "src", "iceberg.tables": "db.t", "bootstrap.servers": "127.0.0.1:1",
                          "group.id": GROUP})
        recovery = Recovery(settings, "127.0.0.1:1", Session(), reader, None, None, None)  # type: ignore[arg-type]
        return await recovery.read_checkpoint()

    with caplog.at_level(logging.WARNING):
        assert asyncio.run(recover()) is None
    assert "coordinator checkpoint at control offset 2 is not readable" in caplog.text
