"""The door to Faust's, mode's and aiokafka's internals: everything icesink does with their
private parts lives in this package, and the rest of agents/ uses only what it exports.

- :mod:`agents.kafka.source_consumer`: read committed records, whole fetches to the ingest
  agent instead of Faust's per-record drain, a consumer that can no longer consume stops the
  replica (:class:`ConsumerGuard`), a poll while every partition is paused, this replica's member
  id, Faust's credentials.
- :mod:`agents.kafka.record_batches`: aiokafka's fetched records taken a record batch at a time.
- :mod:`agents.kafka.group`: LeaveGroup on stop (not as Tansu's leader), a broker that holds
  joins (Tansu), an assignment without Faust's leader topic made again, offset commits; for
  ``icesink connect``'s group (icesink/app/connect_group.py): a rejoin on request, a stop
  without LeaveGroup.
- :mod:`agents.kafka.tables`: Faust's table manager without its one-second start-up wait.
- :mod:`agents.kafka.versions`: the pinned faust-streaming and aiokafka, checked at start-up.

The worker installs it as it starts Faust (agents/faust_app.py ``FaustApp.start``): first
:func:`check_versions`, then the patches, on the app it built. Nothing is patched on import.
"""

from __future__ import annotations

from agents.kafka.group import (
    HELD_JOIN_SESSION_TIMEOUT_MS, OFFSET_FOR_LEADER_EPOCH, commit_offsets, holds_joins, install_leader_check,
    install_leave_group, keeps_departed_leader, request_rejoin, stop_without_leave_group,
)
from agents.kafka.source_consumer import (
    FETCH_MAX_WAIT_MS, ConsumerGuard, Fetched, faust_credentials, group_member_id, group_session_timeout_ms,
    inject_faults, install_batch_drain, isolation_level, serialized_bytes, use_read_committed,
)
from agents.kafka.tables import TablelessManager
from agents.kafka.versions import check as check_versions

__all__ = [
    "FETCH_MAX_WAIT_MS", "HELD_JOIN_SESSION_TIMEOUT_MS", "OFFSET_FOR_LEADER_EPOCH", "ConsumerGuard", "Fetched",
    "check_versions", "commit_offsets", "faust_credentials", "group_member_id", "group_session_timeout_ms",
    "holds_joins", "inject_faults", "install_batch_drain", "install_leader_check", "install_leave_group",
    "isolation_level", "keeps_departed_leader", "request_rejoin", "TablelessManager", "serialized_bytes",
    "stop_without_leave_group", "use_read_committed",
]
