"""A connector's committed offsets, as Kafka Connect's ``GET /connectors/{name}/offsets`` shows a
sink's: read from the tables, not from a consumer group.

icesink's consumer offsets are not the truth of what is committed: every Iceberg commit carries
its sink group's per-partition positions (the table property ``icesink.<group>.state``, else the
snapshot summaries: :func:`icesink.shared.iceberg.latest_sink_summary`), and recovery resumes
from them (:func:`coordinator.recovery.table_positions`: the newest state by control watermark
wins). A position is the next offset to consume, as a Kafka committed offset is.
"""

from __future__ import annotations

import logging
from typing import Any

from icesink.shared.config import Settings
from icesink.shared.protocol import SinkState, TopicPartition

log = logging.getLogger(__name__)


def committed_offsets(settings: Settings) -> list[dict[str, Any]]:
    """Connect's sink offsets (``partition``: ``kafka_topic``, ``kafka_partition``;
    ``offset``: ``kafka_offset``) of the sink group of ``settings``, over its configured tables
    and the tables its newest rounds name (routed tables). Blocking (catalog reads)."""
    return [{"partition": {"kafka_topic": tp.topic, "kafka_partition": tp.partition}, "offset": {"kafka_offset": off}}
            for tp, off in sorted(table_offsets(settings).items(), key=lambda item: (item[0].topic, item[0].partition))]


def table_offsets(settings: Settings) -> dict[TopicPartition, int]:
    """Each partition's position in the tables' sink state of the group (blocking)."""
    from coordinator.recovery import table_positions

    return table_positions(table_states(settings))


def table_states(settings: Settings) -> dict[str, SinkState]:
    """The group's sink state of each table that holds one: the configured tables and those its
    newest rounds name (routed tables). Blocking (catalog reads)."""
    from pyiceberg.exceptions import NoSuchTableError

    from icesink.shared.iceberg import latest_sink_summary, load_catalog

    catalog = load_catalog(settings)
    states = {}
    todo = list(settings.tables)
    while todo:
        name = todo.pop()
        if name in states:
            continue
        try:
            st = latest_sink_summary(catalog.load_table(name), settings.group_id, settings.commit_branch(name))
        except NoSuchTableError:
            continue
        if st is not None:
            states[name] = st
            todo += [t for t in st.round_tables if t not in states]
    return states


# --- altering and resetting (KIP-875), docs/commits.md "Altering and resetting offsets" ---------

ALTERED = "The offsets for this connector have been altered successfully"
RESET = "The offsets for this connector have been reset successfully"
#: The query parameter that lets a change read again records the tables already hold.
ALLOW_DUPLICATES = "allow_duplicates"


class OffsetsRefused(Exception):
    """A change of offsets refused before anything moved: a bad body or partition (400)."""


def parse_sink_offsets(body: Any) -> dict[TopicPartition, int | None]:
    """The body of ``PATCH /connectors/{name}/offsets`` as Kafka Connect reads a sink's
    (``SinkUtils.parseSinkConnectorOffsets``, same checks and messages): partition -> offset, None
    meaning "from the beginning" (a reset of that partition). Also refused: a negative offset."""
    offsets = body.get("offsets") if isinstance(body, dict) else None
    if not isinstance(offsets, list) or not offsets:
        raise OffsetsRefused("Partitions / offsets need to be provided for an alter offsets request")
    out: dict[TopicPartition, int | None] = {}
    for item in offsets:
        partition = item.get("partition") if isinstance(item, dict) else None
        if not isinstance(partition, dict):
            raise OffsetsRefused("The partition for a sink connector offset cannot be null or missing")
        if "kafka_topic" not in partition or "kafka_partition" not in partition:
            raise OffsetsRefused("The partition for a sink connector offset must contain the keys 'kafka_topic' "
                                 "and 'kafka_partition'")
        topic, number = partition["kafka_topic"], partition["kafka_partition"]
        if topic is None:
            raise OffsetsRefused("Kafka topic names must be valid strings and may not be null")
        if number is None:
            raise OffsetsRefused("Kafka partitions must be valid numbers and may not be null")
        p = _integer(number)
        if p is None or not 0 <= p < 2**31:
            raise OffsetsRefused(f"Failed to parse the following Kafka partition value in the provided offsets: "
                                 f"'{number}'. Partition values for sink connectors need to be integers.")
        offset = item.get("offset")
        if offset is None:
            out[TopicPartition(str(topic), p)] = None
            continue
        if not isinstance(offset, dict) or "kafka_offset" not in offset:
            raise OffsetsRefused("The offset for a sink connector should either be null or contain the key "
                                 "'kafka_offset'")
        value = _integer(offset["kafka_offset"])
        if value is None or not 0 <= value < 2**63:
            raise OffsetsRefused(f"Failed to parse the following Kafka offset value in the provided offsets: "
                                 f"'{offset['kafka_offset']}'. Offset values for sink connectors need to be integers "
                                 "(icesink: from 0)")
        out[TopicPartition(str(topic), p)] = value
    return out


def _integer(value: Any) -> int | None:
    """Connect takes 10 and "10" alike (``Long.parseLong(String.valueOf(v))``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit() and value == value.strip():
        return int(value)
    return None


def plan_offsets(
    name: str, wanted: dict[TopicPartition, int | None], committed: dict[TopicPartition, int],
    begin: dict[TopicPartition, int], end: dict[TopicPartition, int], allow_duplicates: bool,
) -> dict[TopicPartition, int]:
    """Each partition's new position (None: its beginning), checked against the partition
    (``begin``/``end``: its log start and end offsets) and the tables (``committed``: the
    positions they hold). Moving a partition back below its position in the tables reads records
    they hold again, that is duplicates: refused unless ``allow_duplicates`` (the operator
    truncated the tables, or wants them)."""
    gone = sorted(str(tp) for tp in wanted if tp not in end)
    if gone:
        raise OffsetsRefused(f"Cannot alter the offsets of connector {name}: partition(s) {', '.join(gone)} do not "
                             "exist")
    new = {tp: begin[tp] if off is None else off for tp, off in wanted.items()}
    beyond = sorted(f"{tp} (offset {off}, end {end[tp]})" for tp, off in new.items() if off > end[tp])
    if beyond:
        raise OffsetsRefused(f"Cannot alter the offsets of connector {name}: offsets past the partition's end: "
                             f"{', '.join(beyond)}")
    back = sorted(f"{tp} (to {off}, the tables hold up to {committed[tp]})"
                  for tp, off in new.items() if tp in committed and off < committed[tp])
    if back and not allow_duplicates:
        raise OffsetsRefused(
            f"Moving the offsets of connector {name} back reads again records its tables already hold, and "
            f"they would hold them twice: {', '.join(back)}. icesink delivers each record exactly once and does "
            f"not do this by default. To do it anyway (the tables were truncated, or duplicates are wanted), add "
            f"?{ALLOW_DUPLICATES}=true to the request")
    return new


def check_not_in_doubt(name: str, states: dict[str, SinkState]) -> None:
    """Refuse to move positions while a round is in doubt (a table lacks the round another
    holds: the coordinator was stopped between two table commits): only its recovery can roll
    that table forward, from the positions as they are."""
    from coordinator.recovery import doubt

    if not states:
        return
    newest_table, newest, doubtful, missing = doubt(states)
    if doubtful or missing:
        raise OffsetsRefused(
            f"Cannot alter the offsets of connector {name} now: table(s) {', '.join(sorted([*doubtful, *missing]))} "
            f"lack round {newest.commit_id} that table {newest_table} holds. Resume the connector until that round is "
            "committed everywhere (its status shows no round in doubt), stop it and try again")


def lower_table_positions(settings: Settings, new: dict[TopicPartition, int]) -> list[str]:
    """Write into each table's sink state of the group the positions ``new`` moves back (a
    property-only commit, no snapshot, the rest of the state as it is): the tables stay the
    truth for positions, and the orphan sweep's fence (a worker's file is dead once the table's
    position passed where it began) holds files read again from the lower positions. Positions
    moved forward are left to the next commit (a response accepted before the change may still
    commit files that start there). Returns the tables written. Blocking."""
    from dataclasses import replace

    from icesink.shared.iceberg import load_catalog
    from icesink.shared.protocol import state_property

    catalog = load_catalog(settings)
    written = []
    for name, st in sorted(table_states(settings).items()):
        lowered = {tp: min(off, new.get(tp, off)) for tp, off in st.positions.items()}
        if lowered == st.positions:
            continue
        table = catalog.load_table(name)
        tx = table.transaction()
        tx.set_properties({state_property(settings.group_id): replace(st, positions=lowered).to_json()})
        tx.commit_transaction()
        written.append(name)
    return written


async def change_offsets(settings: Settings, bootstrap: str, wanted: dict[TopicPartition, int | None] | None,
                         allow_duplicates: bool, name: str, reason: str | None = None) -> dict[TopicPartition, int]:
    """Move the sink group of a stopped connector to new positions (``wanted``; None: a reset,
    every partition the tables hold and every partition of its topics to its beginning), and
    return the new positions. Two writes, in this order:

    1. an ``alter-positions`` event on the group's control log, signed as its replicas sign,
       which the coordinator applies in log order (where the truth is: the tables' positions,
       then the log): the next start reads each partition from its new position, exactly once
       from there (only for a group that has run: one that never did has no position to move);
    2. the group's consumer offsets, as Kafka Connect alters a sink's: the hint where a
       partition no table and no control event knows starts.
    A failure between them leaves the hint behind, which is harmless (the log wins)."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition as KafkaTP
    from aiokafka.errors import KafkaError
    from aiokafka.structs import OffsetAndMetadata

    from icesink.shared.control import ControlProducer
    from icesink.shared.group_secret import stored_keyring
    from icesink.shared.iceberg import load_catalog
    from icesink.shared.kafka_admin import TopicError, end_offsets
    from coordinator.recovery import table_positions
    from icesink.shared.protocol import AlterPositions, Position

    states = await asyncio.to_thread(table_states, settings)
    check_not_in_doubt(name, states)
    committed = table_positions(states)
    client = settings.kafka_client_kwargs()
    topics = set(settings.topics if wanted is None else ()) | {tp.topic for tp in (committed if wanted is None else wanted)}
    ends: dict[TopicPartition, int] = {}
    for topic in sorted(topics):
        try:  # (the true ends: Tansu's ListOffsets answer is too low)
            ends.update({TopicPartition(topic, p): off for p, off in (await end_offsets(bootstrap, topic,
                                                                                         client_kwargs=client)).items()})
        except TopicError as exc:
            if exc.retriable:
                raise
    reset = wanted is None
    if wanted is None:
        every = {tp for tp in ends if tp.topic in settings.topics}
        wanted = dict.fromkeys(sorted(set(committed) | every, key=lambda tp: (tp.topic, tp.partition)), None)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=settings.group_id, enable_auto_commit=False,
                                **client)
    await consumer.start()
    try:
        ktps = {tp: KafkaTP(tp.topic, tp.partition) for tp in wanted if tp in ends}
        begin = await consumer.beginning_offsets(list(ktps.values())) if ktps else {}
        new = plan_offsets(name, wanted, committed, {tp: int(begin[k]) for tp, k in ktps.items()},
                           {tp: ends[tp] for tp in ktps}, allow_duplicates)
        catalog = await asyncio.to_thread(load_catalog, settings)
        keyring = await stored_keyring(settings, bootstrap, catalog)
        sent = bool(new) and (keyring is not None or bool(committed))
        if sent:
            producer = ControlProducer(bootstrap, settings.control_topic, settings.group_id,
                                       settings.control_client_kwargs(), secret=keyring)
            await producer.start()
            try:
                event = AlterPositions(tuple(Position(tp, off) for tp, off in new.items()), reason or
                                       f"offsets of connector {name} {'reset' if reset else 'altered'} by icesink connect")
                offset = await producer.send(event)
            finally:
                await producer.stop()
            log.warning("connector %s: positions altered at control offset %d: %s", name, offset,
                        ", ".join(f"{tp}@{off}" for tp, off in new.items()))
            lowered = await asyncio.to_thread(lower_table_positions, settings, new)
            if lowered:
                log.warning("connector %s: positions moved back in the sink state of %s", name, ", ".join(lowered))
        if new:
            consumer.assign(list(ktps.values()))
            try:
                await consumer.commit({ktps[tp]: OffsetAndMetadata(off, "") for tp, off in new.items()})
            except KafkaError as exc:  # e.g. the stopped replicas' members not yet expired from the group
                if not sent:
                    raise RuntimeError(
                        f"Failed to alter consumer group offsets for connector {name}: {exc}. Its tasks may not have "
                        "stopped completely yet (their group members expire after the session timeout); if the "
                        "connector is STOPPED, this can be safely retried") from None
                log.warning("connector %s: the sink group's offsets (a hint) were not moved (%s); the positions on "
                            "the control log are what its coordinator resumes from", name, exc)
    finally:
        await consumer.stop()
    return new
