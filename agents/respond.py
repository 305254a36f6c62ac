"""Sending one worker response (docs/commits.md, step 5): the ``DataWritten`` events, each split
so that it fits the control topic, all at once, then the ``DataComplete`` that counts them.

A ``DataWritten`` carries every file's column statistics; a table with many columns written
into many files can pass what a broker takes in one record (Kafka's default
``message.max.bytes`` is about 1 MiB; the control producer's ``max_request_size`` is
:data:`icesink.shared.control.MAX_REQUEST_BYTES`). The coordinator merges the DataWritten events of
one response per table, so splitting one into several changes nothing but their count, which
``DataComplete.events_sent`` carries.

If any send fails the response stays incomplete, so it is never accepted: the caller must
keep its buffers for the next round (:class:`ResponseSendError`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from icesink.shared import protocol
from icesink.shared.control import MAX_REQUEST_BYTES
from icesink.shared.errors import ProtocolError, ResponseSendError
from icesink.shared.protocol import DataComplete, DataWritten

#: Largest encoded DataWritten sent: under Kafka's default message.max.bytes (1 MiB) and far
#: under the control producer's max_request_size.
MAX_EVENT_BYTES = 512 * 1024
assert MAX_EVENT_BYTES < MAX_REQUEST_BYTES


class Sender(Protocol):
    def send(self, event: protocol.Event) -> Awaitable[int]: ...


def split_written(ev: DataWritten, max_bytes: int = MAX_EVENT_BYTES) -> list[DataWritten]:
    """``ev`` as one or more DataWritten of the same round, response and table, in file order,
    each encoding to at most ``max_bytes``. Raises :class:`ProtocolError` for a file whose
    statistics alone do not fit."""
    if len(protocol.encode(ev)) <= max_bytes:
        return [ev]
    base = len(protocol.encode(dataclasses.replace(ev, files=())))
    out: list[DataWritten] = []
    current: list[protocol.FileInfo] = []
    size = base
    for f in ev.files:
        # what one more file adds: its JSON and a separating comma
        extra = len(protocol.encode(dataclasses.replace(ev, files=(f,)))) - base + 1
        if base + extra > max_bytes:
            raise ProtocolError(
                f"table {ev.table}: expected a DataWritten of at most {max_bytes} bytes, found {base + extra} "
                f"bytes for the one file {f.path} (its column statistics); collect statistics of fewer "
                "columns (table properties write.metadata.metrics.default / write.metadata.metrics.column.*)"
            )
        if current and size + extra > max_bytes:
            out.append(dataclasses.replace(ev, files=tuple(current)))
            current, size = [], base
        current.append(f)
        size += extra
    out.append(dataclasses.replace(ev, files=tuple(current)))
    # a mirror table's keys files go once, with the first part (the others' sizes only shrink)
    return [out[0], *(dataclasses.replace(p, deleted_keys=()) for p in out[1:])]


async def send_response(
    producer: Sender,
    written: Sequence[DataWritten],
    complete: Callable[[int], DataComplete],
    after_each: Callable[[], None] = lambda: None,
    max_bytes: int = MAX_EVENT_BYTES,
) -> int:
    """Send ``written`` (split by :func:`split_written`), calling ``after_each`` after each
    DataWritten (a fault-test hook), then ``complete(number of DataWritten sent)``. Returns
    that number. Raises :class:`ResponseSendError` when a send fails: the response is then
    incomplete, never accepted, and the caller keeps its data for the next round."""
    try:
        parts = [p for ev in written for p in split_written(ev, max_bytes)]
    except ProtocolError as exc:  # a file that fits no event: loud every round, data kept
        raise ResponseSendError(f"response not sent: {exc}") from exc
    # Every DataWritten at once: the producer batches them into a few requests, where one
    # send awaited after another cost a broker round trip each (200 tables: 200 round trips, a
    # tenth of a second or more a round). Their order does not matter; the DataComplete goes
    # only once the broker has all of them.
    sends = [asyncio.ensure_future(producer.send(part)) for part in parts]
    sent = 0
    try:
        for send in sends:
            await send
            sent += 1
            after_each()
        await producer.send(complete(len(parts)))
    except Exception as exc:  # broker down, record too large, timeout: the round is answered later
        what = f"DataWritten {sent + 1} of {len(parts)}" if sent < len(parts) else "DataComplete"
        raise ResponseSendError(f"sending {what} failed ({type(exc).__name__}: {exc})") from exc
    finally:
        for send in sends:  # after a failure or a cancellation: none left behind, none unawaited
            send.cancel()
        await asyncio.gather(*sends, return_exceptions=True)
    return len(parts)
