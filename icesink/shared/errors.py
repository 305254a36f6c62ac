"""One error root for icesink. Leaf module: imports nothing with I/O.

Every subclass says whether retrying the same operation may succeed (``retriable``), and
retry loops branch on it (:func:`is_retriable`).
A bad record is a :class:`DataError` (dead-letter or fail the record, keep going);
a bad configuration is a :class:`ConfigError` (fatal at start-up).
"""

from __future__ import annotations


class IcesinkError(Exception):
    """Root of every error icesink raises on purpose."""

    retriable: bool = False


def is_retriable(exc: BaseException) -> bool:
    """Whether doing again what raised ``exc`` may succeed, as retry loops decide it: an
    icesink error says so itself (``retriable``); any other error (a catalog's, a broker's, the
    operating system's: a conflict, a timeout, a refused connection) is taken as transient.
    Retry loops retry the transient with capped backoff and stop on the rest, loudly: the
    coordinator's commits (coordinator/round_commit.py), its schema updates (coordinator/service.py), the worker's writes
    (agents/rounds.py); maintenance, never fatal, waits its longest backoff instead."""
    return exc.retriable if isinstance(exc, IcesinkError) else True


class ConfigError(IcesinkError):
    """Invalid settings: names the key, the value found and what is valid. Fatal at start-up."""

    def __init__(self, key: str, value: object, expected: str) -> None:
        self.key = key
        self.value = value
        self.expected = expected
        super().__init__(f"invalid setting {key!r}: expected {expected}, found {value!r}")


def _placed(reason: str, **where: object) -> str:
    """``reason (topic=t, partition=0, offset=5, ...)``: where it happened, the known parts."""
    known = [f"{k}={v}" for k, v in where.items() if v is not None]
    return f"{reason} ({', '.join(known)})" if known else reason


class DataError(IcesinkError):
    """A record that cannot be decoded or coerced. Names where it came from and which field."""

    def __init__(
        self,
        reason: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        field: str | None = None,
    ) -> None:
        self.reason = reason
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.field = field
        super().__init__(_placed(reason, topic=topic, partition=partition, offset=offset, field=field))


class UnsupportedTypeError(IcesinkError):
    """A column type one stage cannot handle (JSON conversion, the Parquet writers).
    Fatal for the table: names the field, the type, what is supported and what to do."""

    def __init__(self, field: str, type_: object, problem: str, supported: str, remedy: str) -> None:
        self.field = field
        self.type = type_
        super().__init__(f"field {field!r}: {problem} {type_}; expected one of {supported}; {remedy}")


class ProtocolError(IcesinkError):
    """A control-topic event that breaks the commit protocol (unknown type, newer version...)."""


class PreconditionFailed(IcesinkError):
    """A commit precondition did not hold: 'expected X, found Y'. The response is rejected."""

    def __init__(self, what: str, expected: object, found: object) -> None:
        self.what = what
        self.expected = expected
        self.found = found
        super().__init__(f"{what}: expected {expected}, found {found}")


class CommitFailed(IcesinkError):
    """An Iceberg table commit failed (conflict, catalog unreachable). Retried with backoff."""

    retriable = True


class TableChangedError(IcesinkError):
    """Another writer dropped a table or changed it so that accepted files no longer fit it
    (their partition spec is gone). The commit is retried (the accepted files are never
    dropped) and the error shown in the log, ``icesink_commit_failures_total`` and /status
    until an operator restores the table."""

    retriable = True


class FencedError(IcesinkError):
    """A newer coordinator epoch holds the table: this coordinator must stop committing."""


class ControlLogError(IcesinkError):
    """The control log is not the one the tables' sink state came from (recreated, emptied,
    compacted or truncated past what is needed): its offsets no longer compare with the
    tables' watermarks. The coordinator refuses to commit; an operator must act."""


class RewindPending(ControlLogError):
    """A table holds a rewind of the group that was interrupted after its table commit
    (``icesink.<group>.rewind-pending``): the control log still says to read on from the old
    positions, so starting would lose the records rolled back. A worker refuses to start (exit
    2), a coordinator to commit or resume any partition, until ``icesink rewind`` is run again."""


class ControlSecretError(IcesinkError):
    """The group's control secret could not be read or stored in the catalog
    (icesink/shared/group_secret.py): names the namespace, the property and what to do. Fatal at start."""


class ResponseSendError(IcesinkError):
    """A worker could not send its response to the control topic. The response stays
    incomplete (never accepted); the worker keeps its buffers and answers the next round."""

    retriable = True


class SparkWriteError(IcesinkError):
    """Spark failed to write data files. The round's response is not sent; the data is retried."""

    retriable = True


class WritesKeepFailing(IcesinkError):
    """Writing files failed ``write.failure-limit`` times in a row, retried with backoff: the
    replica stops (exit code 2) with the last failure, rather than holding its partitions for
    ever; their next owner reads the data again."""


class ConsumerError(IcesinkError):
    """The source consumer can no longer consume (a batch it cannot decode, a fatal error of its
    group membership or its thread). Fatal for the replica: it stops with a non-zero exit code,
    and the partitions move to the other replicas, which resume from the accepted positions."""

    def __init__(
        self,
        reason: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        service: str | None = None,
    ) -> None:
        self.reason = reason
        self.topic = topic
        self.partition = partition
        self.offset = offset
        super().__init__(_placed(reason, topic=topic, partition=partition, offset=offset, **{"in": service}))


class StartFailure(IcesinkError):
    """A process could not start for a reason of its surroundings that a user fixes (a broker that is
    down, a catalog that cannot be reached, a file it may not use): one line naming what and where
    (icesink/app/start_failures.py)."""
