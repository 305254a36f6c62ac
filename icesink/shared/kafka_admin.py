"""Small Kafka admin helpers on aiokafka: create a topic if missing, read high watermarks.

``client_kwargs`` are connection settings passed to every aiokafka client these helpers open
(``client_id``, ``security_protocol``, ``ssl_context``, ``sasl_*``, ``request_timeout_ms``...);
they must be accepted by both ``AIOKafkaAdminClient`` and ``AIOKafkaConsumer``.

Broker behaviour this relies on (checked against Tansu v0.6.0-510f3e2):

- A metadata request that names a missing topic *creates* it (Tansu: 4 partitions) unless
  ``allow_auto_topic_creation`` is false, and aiokafka's ``describe_topics([name])`` sets it to
  true. So a missing topic is only ever looked up through the all-topics metadata request.
- ``ListOffsets(latest)`` answers the base offset of the last record batch + 1, which is lower
  than the high watermark whenever the last batch holds more than one record. ``end_offsets``
  corrects it from a fetch; do not use ``AIOKafkaConsumer.end_offsets`` or ``seek_to_end`` alone.
- Every JoinGroup is held for about half of ``session_timeout_ms`` (about 5 s with aiokafka's
  default of 10 s, 23 s with 45 s): a new group's first join and every rebalance. Short session
  timeouts make tests fast; a worker that does not set one uses 6 s here (agents/faust_app.py).
- A member that sends LeaveGroup while its group is rebalancing is dropped but stays the
  group's leader if it was; new members then wait for its assignment until something reloads
  the group. icesink's group leader stops without LeaveGroup on Tansu (``agents/faust_app.py``).
- ``CreateTopics`` for an existing topic answers error 36 (TopicAlreadyExists); aiokafka returns
  the response instead of raising, so the error codes are checked here.
- ``DeleteRecords`` is listed in its ApiVersions (v0-v2) but not implemented: the broker's task
  panics ("not yet implemented") and the connection closes. ``delete_records`` tells that from
  a broker that is down by asking for metadata on a new connection right after.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from icesink.shared.errors import IcesinkError
from icesink.shared.retry import Backoff

__all__ = [
    "DeleteRecordsUnsupported", "TopicError", "delete_records", "end_offsets", "ensure_topic", "group_offset",
    "partition_counts",
    "topic_configs", "topic_exists", "topic_id",
]

logger = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS: Final = 36
_INVALID_REPLICATION_FACTOR: Final = 38
_POLL_INTERVAL_S: Final = 0.05
_FIRST_BACKOFF_S: Final = 0.05
_MAX_BACKOFF_S: Final = 1.0
#: A partition-count mismatch on an existing topic must persist this long before it is an error
#: (metadata of a topic another client is creating right now may still be filling in).
_MISMATCH_GRACE_S: Final = 2.0


class TopicError(IcesinkError):
    """A topic is missing, has the wrong shape, or could not be created."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class DeleteRecordsUnsupported(TopicError):
    """The broker does not delete records on request. ``definite``: it said so (no DeleteRecords
    version, UNSUPPORTED_VERSION); else it closed the connection at the request while it answers
    others (Tansu), which a connection lost by chance looks like once: the caller asks again
    before it believes it."""

    def __init__(self, message: str, *, definite: bool = True) -> None:
        super().__init__(message, retriable=not definite)
        self.definite = definite


async def ensure_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    *,
    replication_factor: int = 1,
    configs: Mapping[str, str] | None = None,
    client_kwargs: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
    setting: str = "the topic's replication-factor setting",
) -> None:
    """Create topic ``name`` with ``partitions`` partitions (and topic ``configs``) unless it
    exists, then wait for it. ``setting`` names the key that chose ``replication_factor``, for
    the error when the cluster has fewer brokers.

    Returns once the broker's metadata lists all ``partitions`` partitions with a leader.
    Raises :class:`TopicError` if the topic exists with another partition count, if the broker
    refuses to create it, or if it is not ready within ``timeout_s``.
    """
    if partitions < 1:
        raise ValueError(f"partitions: expected >= 1, found {partitions}")
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **dict(client_kwargs or {}))
    began = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            created = await _create_topic(admin, name, partitions, replication_factor, configs or {}, setting)
            await _wait_for_partitions(admin, name, partitions, created=created)
    except TimeoutError:
        raise TopicError(
            f"topic {name!r}: expected {partitions} partitions with leaders within "
            f"{timeout_s:.1f} s, timed out. Is the broker at {bootstrap} up?",
            retriable=True,
        ) from None
    finally:
        await admin.close()
    logger.info(
        "topic %r %s with %d partitions in %.3f s",
        name,
        "created" if created else "already existed",
        partitions,
        time.monotonic() - began,
    )


async def topic_exists(
    bootstrap: str, name: str, *, client_kwargs: Mapping[str, Any] | None = None, timeout_s: float = 30.0
) -> bool:
    """Whether topic ``name`` exists (asked without auto-creating it)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **dict(client_kwargs or {}))
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            return await _existing_topic_metadata(admin, name) is not None
    except TimeoutError:
        raise TopicError(f"topic {name!r}: metadata not read within {timeout_s:.1f} s", retriable=True) from None
    finally:
        await admin.close()


async def partition_counts(
    bootstrap: str, *, client_kwargs: Mapping[str, Any] | None = None, timeout_s: float = 30.0
) -> dict[str, int]:
    """Topic -> number of partitions, of every topic on the cluster (asked without auto-creating
    any). A consumer's own metadata is no answer: on Kafka it holds only the topics that consumer
    asked about (Tansu's holds every topic)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **dict(client_kwargs or {}))
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            topics: list[dict[str, Any]] = await admin.describe_topics()
    except TimeoutError:
        raise TopicError(f"topic metadata not read within {timeout_s:.1f} s", retriable=True) from None
    finally:
        await admin.close()
    return {t["topic"]: len(t["partitions"]) for t in topics if int(t.get("error_code", 0)) == 0}


async def end_offsets(
    bootstrap: str,
    topic: str,
    *,
    client_kwargs: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> dict[int, int]:
    """Partition -> high watermark (offset of the next record) of every partition of ``topic``.

    Correct on Tansu too, whose ListOffsets answer is too low (see ``_true_end_offsets``).
    Raises :class:`TopicError` if the topic does not exist (it is never auto-created here).
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    kwargs = dict(client_kwargs or {})
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **kwargs)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **kwargs
    )
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            meta = await _existing_topic_metadata(admin, topic)
            if meta is None:
                raise TopicError(f"topic {topic!r}: expected it to exist, found no such topic")
            tps = [TopicPartition(topic, int(p["partition"])) for p in meta["partitions"]]
            await consumer.start()
            offsets = await _true_end_offsets(consumer, tps)
    except TimeoutError:
        raise TopicError(
            f"topic {topic!r}: end offsets not read within {timeout_s:.1f} s", retriable=True
        ) from None
    finally:
        await consumer.stop()
        await admin.close()
    return {tp.partition: int(offset) for tp, offset in sorted(offsets.items())}


async def _true_end_offsets(consumer: Any, tps: list[Any]) -> dict[Any, int]:
    """High watermarks from a fetch, not only from ListOffsets.

    Tansu answers ListOffsets(latest) with the *base offset of the last record batch* + 1, not
    the last offset + 1 (a batch of 10 records at offsets 2..11 gives 3, not 12). Its fetch
    responses carry the right high watermark. So: ListOffsets gives a lower bound L; fetching
    from L - 1 (inside the last batch) returns the fetch high watermark. On Kafka both agree.
    """
    listed: dict[Any, int] = {tp: int(o) for tp, o in (await consumer.end_offsets(tps)).items()}
    pending = {tp for tp, offset in listed.items() if offset > 0}
    if not pending:
        return listed
    consumer.assign(sorted(pending))
    for tp in pending:
        consumer.seek(tp, listed[tp] - 1)
    result = dict(listed)
    while pending:
        fetched = await consumer.getmany(*pending, timeout_ms=200)
        for tp, records in fetched.items():
            if records:
                result[tp] = max(result[tp], records[-1].offset + 1)
        for tp in list(pending):
            highwater = consumer.highwater(tp)
            if highwater is not None:
                result[tp] = max(result[tp], int(highwater))
                pending.discard(tp)
    return result


async def _create_topic(
    admin: Any, name: str, partitions: int, replication_factor: int, configs: Mapping[str, str], setting: str
) -> bool:
    """Send CreateTopics until it succeeds; True if this call created the topic."""
    from aiokafka.admin import NewTopic
    from aiokafka.errors import for_code

    backoff = Backoff(_FIRST_BACKOFF_S, _MAX_BACKOFF_S)
    while True:
        response = await admin.create_topics(
            [NewTopic(name, partitions, replication_factor, topic_configs=dict(configs))]
        )
        # topic_errors rows are (topic, error_code) or (topic, error_code, error_message).
        row = next(r for r in response.topic_errors if r[0] == name)
        code, message = int(row[1]), (row[2] if len(row) > 2 else None)
        if code == 0:
            return True
        if code == _TOPIC_ALREADY_EXISTS:
            return False
        error = for_code(code)
        if code == _INVALID_REPLICATION_FACTOR:
            raise TopicError(
                f"topic {name!r}: expected a cluster with at least {replication_factor} brokers for replication "
                f"factor {replication_factor}, the broker refused: {message}. Lower {setting} to the number "
                "of brokers."
            )
        if not getattr(error, "retriable", False):
            raise TopicError(
                f"topic {name!r}: broker refused to create it: {error.__name__} "
                f"(error {code}): {message}"
            )
        logger.debug("create topic %r: retriable %s, retrying", name, error.__name__)
        await asyncio.sleep(backoff.next())


async def _existing_topic_metadata(admin: Any, name: str) -> dict[str, Any] | None:
    """Metadata of ``name`` from the all-topics request, which never auto-creates topics."""
    topics: list[dict[str, Any]] = await admin.describe_topics()
    return next((t for t in topics if t["topic"] == name), None)


async def _wait_for_partitions(admin: Any, name: str, partitions: int, *, created: bool) -> None:
    mismatch_since: float | None = None
    while True:
        meta = await _existing_topic_metadata(admin, name)
        found = _ready_partitions(meta)
        total = len(meta["partitions"]) if meta is not None else 0
        if found == partitions == total:
            return
        if not created and meta is not None and total > 0 and total != partitions:
            now = time.monotonic()
            mismatch_since = mismatch_since if mismatch_since is not None else now
            if now - mismatch_since >= _MISMATCH_GRACE_S:
                raise TopicError(
                    f"topic {name!r}: expected {partitions} partitions, found {total}. "
                    "Use a new topic name, or delete the topic so it is created again."
                )
        else:
            mismatch_since = None
        await asyncio.sleep(_POLL_INTERVAL_S)


def _ready_partitions(meta: Mapping[str, Any] | None) -> int:
    """Number of partitions with a leader, or -1 if the topic itself reports an error."""
    if meta is None or int(meta.get("error_code", 0)) != 0:
        return -1
    return sum(
        1
        for p in meta["partitions"]
        if int(p.get("error_code", 0)) == 0 and int(p.get("leader", -1)) >= 0
    )


async def topic_configs(
    bootstrap: str, name: str, *, client_kwargs: Mapping[str, Any] | None = None, timeout_s: float = 30.0
) -> dict[str, str]:
    """The configs of topic ``name`` (DescribeConfigs), as the broker reports them."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **dict(client_kwargs or {}))
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
    except TimeoutError:
        raise TopicError(f"topic {name!r}: configs not read within {timeout_s:.1f} s", retriable=True) from None
    finally:
        await admin.close()
    out: dict[str, str] = {}
    for response in responses:
        for resource in response.resources:
            if int(resource[0]) != 0:
                raise TopicError(f"topic {name!r}: DescribeConfigs answered error {resource[0]}: {resource[1]}")
            for entry in resource[4]:
                if entry[1] is not None:
                    out[str(entry[0])] = str(entry[1])
    return out


async def topic_id(
    bootstrap: str, name: str, *, client_kwargs: Mapping[str, Any] | None = None, timeout_s: float = 30.0
) -> str | None:
    """The topic id (a UUID given at creation; a recreated topic gets a new one) of ``name``,
    from Metadata v10+ (Kafka 2.8+, Tansu). None if the broker has no topic ids (older
    versions answer no Metadata v10, or an all-zero id). Never creates the topic."""
    import uuid

    response = await _metadata_v10_answer(bootstrap, [name], client_kwargs, timeout_s, f"topic {name!r}: ")
    if response is None:
        return None  # the broker speaks no Metadata v10: no topic ids
    for error_code, topic, raw_id in ((t[0], t[1], t[2]) for t in response.topics):
        if topic != name:
            continue
        if int(error_code) != 0:
            raise TopicError(f"topic {name!r}: expected it to exist, metadata answered error {error_code}")
        found = uuid.UUID(bytes=raw_id)
        return None if found.int == 0 else str(found)
    raise TopicError(f"topic {name!r}: expected it in the metadata answer, found {[t[1] for t in response.topics]}")


async def cluster_id(
    bootstrap: str, *, client_kwargs: Mapping[str, Any] | None = None, timeout_s: float = 30.0
) -> str | None:
    """The Kafka cluster's id (what Kafka Connect's ``GET /`` shows as ``kafka_cluster_id``), from
    Metadata v10+; None if the broker answers no Metadata v10 or gives no id."""
    response = await _metadata_v10_answer(bootstrap, [], client_kwargs, timeout_s, "")
    return None if response is None or not response.cluster_id else str(response.cluster_id)


async def _metadata_v10_answer(bootstrap: str, names: list[str], client_kwargs: Mapping[str, Any] | None,
                               timeout_s: float, what: str) -> Any:
    """Metadata v10's answer for ``names`` (never creating a topic), or None if the broker
    speaks no Metadata v10."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.errors import IncompatibleBrokerVersion

    # aiokafka's own client (what its admin client wraps and starts with bootstrap()): the
    # request is one aiokafka does not have, sent as is.
    client = AIOKafkaClient(bootstrap_servers=bootstrap, **dict(client_kwargs or {}))
    try:
        async with asyncio.timeout(timeout_s):
            await client.bootstrap()
            node = client.get_random_node()
            try:
                return await client.send(node, _TopicIdRequest(names))
            except (NotImplementedError, IncompatibleBrokerVersion):
                return None
    except TimeoutError:
        raise TopicError(f"{what}metadata not read within {timeout_s:.1f} s", retriable=True) from None
    finally:
        await client.close()


def _metadata_v10() -> Any:
    """aiokafka 0.14 speaks Metadata up to v5, which has no topic ids: v10 (the first with them,
    flexible encoding) is declared here from the Kafka protocol's MetadataRequest.json."""
    from io import BytesIO

    from aiokafka.protocol.api import Request, RequestStruct, Response
    from aiokafka.protocol.types import (
        AbstractType, Boolean, CompactArray, CompactString, Int16, Int32, Schema, TaggedFields,
    )

    class Uuid(AbstractType[bytes]):  # type: ignore[misc]  # aiokafka has no type information
        @classmethod
        def encode(cls, value: bytes) -> bytes:
            return value

        @classmethod
        def decode(cls, data: BytesIO) -> bytes:
            return data.read(16)

    class MetadataResponse_v10(Response):  # type: ignore[misc]  # aiokafka has no type information
        API_KEY = 3
        API_VERSION = 10
        SCHEMA = Schema(
            ("throttle_time_ms", Int32),
            ("brokers", CompactArray(("node_id", Int32), ("host", CompactString("utf-8")), ("port", Int32),
                                     ("rack", CompactString("utf-8")), ("tags", TaggedFields))),
            ("cluster_id", CompactString("utf-8")),
            ("controller_id", Int32),
            ("topics", CompactArray(
                ("error_code", Int16), ("name", CompactString("utf-8")), ("topic_id", Uuid),
                ("is_internal", Boolean),
                ("partitions", CompactArray(
                    ("error_code", Int16), ("partition_index", Int32), ("leader_id", Int32),
                    ("leader_epoch", Int32), ("replica_nodes", CompactArray(Int32)),
                    ("isr_nodes", CompactArray(Int32)), ("offline_replicas", CompactArray(Int32)),
                    ("tags", TaggedFields))),
                ("topic_authorized_operations", Int32), ("tags", TaggedFields))),
            ("cluster_authorized_operations", Int32),
            ("tags", TaggedFields),
        )

    class MetadataRequest_v10(RequestStruct):  # type: ignore[misc]  # aiokafka has no type information
        FLEXIBLE_VERSION = True
        API_KEY = 3
        API_VERSION = 10
        RESPONSE_TYPE = MetadataResponse_v10
        SCHEMA = Schema(
            ("topics", CompactArray(("topic_id", Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields))),
            ("allow_auto_topic_creation", Boolean),
            ("include_cluster_authorized_operations", Boolean),
            ("include_topic_authorized_operations", Boolean),
            ("tags", TaggedFields),
        )

    class TopicIdRequest(Request[MetadataRequest_v10]):  # type: ignore[misc]  # aiokafka has no type information
        API_KEY = 3

        def __init__(self, names: list[str]) -> None:
            self.names = names

        def build(self, request_struct_class: type[MetadataRequest_v10]) -> MetadataRequest_v10:
            # allow_auto_topic_creation=False: asking never creates the topic.
            return request_struct_class([(b"\0" * 16, n, {}) for n in self.names], False, False, False, {})

    return TopicIdRequest


def _TopicIdRequest(names: list[str]) -> Any:  # noqa: N802 - builds the request class once
    global _TOPIC_ID_REQUEST
    if _TOPIC_ID_REQUEST is None:
        _TOPIC_ID_REQUEST = _metadata_v10()
    return _TOPIC_ID_REQUEST(names)


_TOPIC_ID_REQUEST: Any = None


async def delete_records(
    bootstrap: str, topic: str, partition: int, before: int, *,
    client_kwargs: Mapping[str, Any] | None = None, timeout_s: float = 30.0,
) -> int:
    """Delete the records of ``topic``'s ``partition`` below offset ``before`` (Kafka's
    DeleteRecords, as ``kafka-delete-records`` does); returns the partition's new log start.
    Raises :class:`DeleteRecordsUnsupported` when the broker does not do it: it declares no
    DeleteRecords version or answers UNSUPPORTED_VERSION (definite), or closes the connection at
    the request while it answers a metadata request right after (Tansu, see the module doc; not
    definite); :class:`TopicError` otherwise (a refusal, TopicAuthorizationFailed or
    PolicyViolation, too; retriable as Kafka's error is)."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
    from aiokafka.errors import (
        IncompatibleBrokerVersion, KafkaConnectionError, KafkaError, PolicyViolationError,
        TopicAuthorizationFailedError, UnsupportedVersionError,
    )

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **dict(client_kwargs or {}))
    tp = TopicPartition(topic, partition)
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            try:
                done = await admin.delete_records({tp: RecordsToDelete(before)}, timeout_ms=int(timeout_s * 1000))
            except (IncompatibleBrokerVersion, NotImplementedError, UnsupportedVersionError) as exc:
                raise DeleteRecordsUnsupported(f"the broker does not implement DeleteRecords ({exc})") from exc
            except (TopicAuthorizationFailedError, PolicyViolationError) as exc:  # an operator may lift it
                raise TopicError(f"the broker refuses DeleteRecords on topic {topic!r}: "
                                 f"{type(exc).__name__} (allow it, or truncate by hand)") from exc
            except KafkaConnectionError as exc:
                try:
                    await _existing_topic_metadata(admin, topic)
                except Exception:  # noqa: BLE001 - the broker is unreachable: a retriable failure
                    raise TopicError(f"topic {topic!r}: DeleteRecords failed: {exc}", retriable=True) from exc
                raise DeleteRecordsUnsupported(
                    "the broker closed the connection at DeleteRecords while it answers other requests: it does not "
                    "implement it (Tansu, the embedded broker, does not)", definite=False) from exc
            except KafkaError as exc:
                raise TopicError(f"topic {topic!r}: DeleteRecords failed: {type(exc).__name__}: {exc}",
                                 retriable=bool(getattr(exc, "retriable", False))) from exc
    except TimeoutError:
        raise TopicError(f"topic {topic!r}: DeleteRecords not answered within {timeout_s:.1f} s",
                         retriable=True) from None
    finally:
        await admin.close()
    return int(done[tp])


async def group_offset(
    bootstrap: str, group: str, topic: str, partition: int, *,
    client_kwargs: Mapping[str, Any] | None = None, timeout_s: float = 30.0,
) -> int | None:
    """Consumer group ``group``'s committed offset of ``topic``'s ``partition`` (None: none)."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **dict(client_kwargs or {}))
    tp = TopicPartition(topic, partition)
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            offsets = await admin.list_consumer_group_offsets(group, partitions=[tp])
    except TimeoutError:
        raise TopicError(f"group {group!r}: offsets not read within {timeout_s:.1f} s", retriable=True) from None
    finally:
        await admin.close()
    found = offsets.get(tp)
    return None if found is None or found.offset < 0 else int(found.offset)
