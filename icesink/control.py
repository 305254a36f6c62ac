"""Control-topic I/O: one producer per process, and readers positioned by offset.

The control topic has one partition, so its offsets give every event of a sink group one
total order. Events are keyed by the group id; readers skip other groups' events.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition as KafkaTP
from aiokafka.structs import OffsetAndMetadata

from icesink import events
from icesink.errors import ProtocolError
from icesink.kafka_admin import ensure_topic

log = logging.getLogger(__name__)

#: The control producer's max_request_size; responses split their events well below it
#: (agents/respond.py).
MAX_REQUEST_BYTES = 16 * 1024 * 1024


async def ensure_control_topic(bootstrap: str, topic: str, client_kwargs: dict[str, Any]) -> None:
    await ensure_topic(bootstrap, topic, 1, client_kwargs=client_kwargs)


class ControlProducer:
    def __init__(self, bootstrap: str, topic: str, group: str, client_kwargs: dict[str, Any]) -> None:
        self.topic = topic
        self.group = group
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=False,  # brokers without InitProducerId must work
            acks="all",
            linger_ms=0,
            max_request_size=MAX_REQUEST_BYTES,
            **client_kwargs,
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send(self, event: events.Event) -> int:
        """Send one event and wait until the broker has it; returns its control offset."""
        meta = await self._producer.send_and_wait(
            self.topic, events.encode(event), key=self.group.encode(), partition=0
        )
        return int(meta.offset)


class ControlReader:
    """Reads the control partition from a given offset. With ``commit_group`` it can also
    store and fetch a committed offset (the coordinator's checkpoint pointer); it never joins
    a consumer group (manual assignment), so readers never rebalance each other."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        client_kwargs: dict[str, Any],
        commit_group: str | None = None,
    ) -> None:
        self.group = group
        self.tp = KafkaTP(topic, 0)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=commit_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_uncommitted",
            max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
            **client_kwargs,
        )

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign([self.tp])

    async def stop(self) -> None:
        await self._consumer.stop()

    async def seek(self, offset: int) -> None:
        self._consumer.seek(self.tp, offset)

    async def seek_to_end(self) -> int:
        await self._consumer.seek_to_end(self.tp)
        return await self._consumer.position(self.tp)

    async def seek_to_beginning(self) -> int:
        await self._consumer.seek_to_beginning(self.tp)
        return await self._consumer.position(self.tp)

    async def position(self) -> int:
        """The offset of the next event this reader will return."""
        return int(await self._consumer.position(self.tp))

    async def end_offset(self) -> int:
        return int((await self._consumer.end_offsets([self.tp]))[self.tp])

    async def committed(self) -> int | None:
        return await self._consumer.committed(self.tp)

    async def commit(self, offset: int) -> None:
        await self._consumer.commit({self.tp: OffsetAndMetadata(offset, "")})

    async def read(self, timeout_s: float) -> list[tuple[int, events.Event]]:
        """The next batch of this group's events (possibly empty after ``timeout_s``)."""
        batches = await self._consumer.getmany(self.tp, timeout_ms=int(timeout_s * 1000), max_records=5000)
        out: list[tuple[int, events.Event]] = []
        for record in batches.get(self.tp, []):
            if record.key is not None and record.key.decode() != self.group:
                continue
            try:
                out.append((record.offset, events.decode(record.value)))
            except ProtocolError as exc:
                log.error("control offset %d unreadable, skipped: %s", record.offset, exc)
        return out

    async def read_one(self, offset: int, timeout_s: float = 10.0) -> events.Event | None:
        await self.seek(offset)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            for off, ev in await self.read(1.0):
                if off == offset:
                    return ev
                if off > offset:
                    return None
        return None
