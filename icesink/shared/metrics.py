"""Every Prometheus metric icesink exports, declared once. Leaf module: no I/O at import.

``Metrics(registry)`` binds them to a registry; tests pass a fresh ``CollectorRegistry``.
The HTTP exporter is started by the worker runtime (``start_http_server``).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)

# Commits take seconds to tens of seconds; Spark writes likewise.
COMMIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        # No ``_created`` series (a timestamp per counter and histogram child, which no
        # dashboard or alert reads): a fifth of the lines, and of the scrape's CPU, at 200 tables.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        # process_start_time_seconds and friends (read from /proc at scrape time): restarts of a
        # replica show as changes of its start time (deploy/prometheus/alerts.yml, flapping).
        ProcessCollector(registry=r)
        # python_gc_collections_total{generation}: a worker's full collections (generation 2)
        # should stay rare while it ingests (icesink/shared/gc_tuning.py).
        GCCollector(registry=r)
        # The replica itself.
        self.info = Gauge(
            "icesink_info", "1 per replica: its sink group (group.id) and worker id", ["group", "worker"], registry=r)
        self.commit_interval = Gauge(
            "icesink_commit_interval_seconds", "iceberg.control.commit.interval-ms of this replica's group, in seconds",
            registry=r)
        # Workers: consuming and converting.
        self.records_consumed = Counter(
            "icesink_records_consumed_total", "Source records consumed", ["topic"], registry=r)
        self.records_converted = Counter(
            "icesink_records_converted_total", "Records converted to Arrow", ["topic"], registry=r)
        self.records_rejected = Counter(
            "icesink_records_rejected_total", "Records that could not be converted",
            ["topic", "reason"], registry=r)
        self.records_unrouted = Counter(
            "icesink_records_unrouted_total", "Records whose route matches no table (dead-lettered)",
            ["topic"], registry=r)
        self.records_deadlettered = Counter(
            "icesink_records_deadlettered_total",
            "Bad records acknowledged by the dead-letter topic (or written to the local fallback)",
            ["topic", "reason"], registry=r)
        self.deadletter_send_failures = Counter(
            "icesink_deadletter_send_failures_total", "Dead-letter sends that failed (retried)",
            registry=r)
        self.tombstones = Counter(
            "icesink_tombstones_total", "Records with a null value, skipped", ["topic"], registry=r)
        self.bytes_consumed = Counter(
            "icesink_bytes_consumed_total", "Source value bytes consumed", ["topic"], registry=r)
        self.buffered_rows = Gauge(
            "icesink_buffered_rows", "Rows held in memory awaiting a commit round", registry=r)
        self.buffered_bytes = Gauge(
            "icesink_buffered_bytes", "Arrow bytes held in memory awaiting a round", registry=r)
        self.paused_partitions = Gauge(
            "icesink_paused_partitions", "Source partitions paused (claiming or backpressure)",
            registry=r)
        self.early_commit_requests = Counter(
            "icesink_early_commit_requests_total", "CommitRequest events sent, by reason: full buffers, "
            "commit.max-records, commit.max-bytes, rows after an idle round", ["reason"], registry=r)
        self.rounds_held = Counter(
            "icesink_rounds_held_total", "Rounds in which partitions reading a backlog kept their rows "
            "for the round the backlog's end asks for (iceberg.control.commit.catch-up)", registry=r)
        self.uncommitted_age = Gauge(
            "icesink_uncommitted_age_seconds", "Age of the oldest row this replica buffered and no "
            "CommitComplete covered yet, by when it was buffered (0: none)", registry=r)
        self.consumer_failures = Counter(
            "icesink_consumer_failures_total",
            "Fatal errors of the source consumer (each stops the replica)", ["error"], registry=r)
        self.consumer_lag = Gauge(
            "icesink_consumer_lag", "High watermark minus next offset to read",
            ["topic", "partition"], registry=r)
        self.partition_stalls = Counter(
            "icesink_partition_stalls_total",
            "Active partitions behind their high watermark that took no record for a while (sought again)",
            ["topic", "partition"], registry=r)
        # Spark bridge.
        self.files_written = Counter(
            "icesink_files_written_total", "Data files written by Spark", ["table"], registry=r)
        self.bytes_written = Counter(
            "icesink_bytes_written_total", "Data file bytes written by Spark", ["table"], registry=r)
        self.write_duration = Histogram(
            "icesink_write_duration_seconds", "Spark write of one response", buckets=COMMIT_BUCKETS,
            registry=r)
        self.write_failures = Counter(
            "icesink_write_failures_total", "Spark writes that failed", registry=r)
        self.write_failures_in_a_row = Gauge(
            "icesink_write_failures_in_a_row",
            "Writes that failed since the last that succeeded; at write.failure-limit the replica stops", registry=r)
        self.early_writes = Counter(
            "icesink_early_writes_total",
            "Buffered rows written to data files before their round (buffer.write-ahead-bytes). outcome: "
            "landed (waiting for their round), void (a partition they cover moved during the write), dropped "
            "(landed, then a partition they cover moved; its rows are read again)",
            ["outcome"], registry=r)
        for outcome in ("landed", "void", "dropped"):  # at 0 from the start: the dashboard's panel has data
            self.early_writes.labels(outcome=outcome)
        self.written_ahead_rows = Gauge(
            "icesink_written_ahead_rows", "Rows in data files written early, waiting for their round", registry=r)
        # Coordinator.
        self.rounds_started = Counter(
            "icesink_rounds_started_total", "Commit rounds started", registry=r)
        self.round_duration = Histogram(
            "icesink_round_duration_seconds",
            "A commit round from its StartCommit to its CommitComplete (answers, writes, table commits, retries)",
            buckets=COMMIT_BUCKETS, registry=r)
        # Coordinator: table maintenance (coordinator/maintenance.py).
        self.maintenance_files_rewritten = Counter(
            "icesink_maintenance_files_rewritten_total", "Small data files replaced by compaction", ["table"],
            registry=r)
        self.maintenance_files_written = Counter(
            "icesink_maintenance_files_written_total", "Data files written by compaction", ["table"], registry=r)
        self.maintenance_bytes_rewritten = Counter(
            "icesink_maintenance_bytes_rewritten_total", "Bytes of the data files compaction replaced", ["table"],
            registry=r)
        self.maintenance_snapshots_expired = Counter(
            "icesink_maintenance_snapshots_expired_total", "Snapshots removed by expiry", ["table"], registry=r)
        self.maintenance_files_deleted = Counter(
            "icesink_maintenance_files_deleted_total",
            "Files deleted because only expired snapshots referenced them", ["table"], registry=r)
        self.maintenance_orphans_deleted = Counter(
            "icesink_maintenance_orphans_deleted_total",
            "Orphan files deleted by the scheduled sweep (each deletion is also logged)", ["table"], registry=r)
        self.maintenance_orphans_held = Gauge(
            "icesink_maintenance_orphans_held",
            "Unreferenced files the last sweep kept because a round of their sink group may still commit them",
            ["table"], registry=r)
        self.maintenance_failures = Counter(
            "icesink_maintenance_failures_total", "Maintenance steps that failed (retried with backoff)",
            ["table", "step"], registry=r)
        self.maintenance_duration = Histogram(
            "icesink_maintenance_duration_seconds", "One table's maintenance pass (expiry, compaction step)",
            ["table"], buckets=COMMIT_BUCKETS, registry=r)
        self.maintenance_last = Gauge(
            "icesink_maintenance_last_timestamp_seconds", "When the table's last maintenance pass finished",
            ["table"], registry=r)
        self.rounds_committed = Counter(
            "icesink_rounds_committed_total", "Commit rounds completed", registry=r)
        self.rounds_partial = Counter(
            "icesink_rounds_partial_total",
            "Rounds closed on the commit timeout without every partition answering", registry=r)
        self.round_failures = Counter(
            "icesink_round_failures_total",
            "Attempts to finish a round (table commits, CommitToTable, CommitComplete) that failed and are "
            "retried; its accepted responses stay pending", registry=r)
        self.control_events_refused = Counter(
            "icesink_control_events_refused_total",
            "Well-formed control events the coordinator refused (e.g. a DataWritten naming files outside "
            "its table's location)", ["reason"], registry=r)
        self.group_resets = Counter(
            "icesink_consumer_group_resets_total",
            "Consumer-group resets seen in claims (generations restarted): older ownerships voided", registry=r)
        self.files_kept = Counter(
            "icesink_files_kept_total",
            "Files the coordinator was asked to delete but kept: outside the table's location, "
            "referenced by a snapshot, or named by an accepted response", ["reason"], registry=r)
        self.control_events_invalid = Counter(
            "icesink_control_events_invalid_total",
            "Control records skipped because they are not valid events (key not UTF-8, null or non-JSON "
            "value, too large, a bad field); logged once each with their control offset",
            ["reader"], registry=r)
        self.control_secret_reloads = Counter(
            "icesink_control_secret_reloads_total",
            "Times this replica found the group's control secret in the catalog to be another than the one "
            "it signed with (replicas of a new group that made one at once) and took the stored one",
            registry=r)
        self.control_secret_load_failures = Counter(
            "icesink_control_secret_load_failures_total",
            "Failed attempts to read or store the group's control secret in the catalog at start, retried "
            "with capped backoff until the start gives up", registry=r)
        self.coordinator_restarts = Counter(
            "icesink_coordinator_restarts_total",
            "Times this replica restarted its coordinator after an unexpected error", registry=r)
        self.control_events_stale = Counter(
            "icesink_control_events_stale_total",
            "Resume, StartCommit and Rewind events from a coordinator epoch older than the newest this "
            "worker has seen, ignored", ["type"], registry=r)
        self.responses_rejected = Counter(
            "icesink_responses_rejected_total", "Worker responses rejected", ["reason"], registry=r)
        self.orphans_deleted = Counter(
            "icesink_orphan_files_deleted_total",
            "Data files deleted because their response was rejected or abandoned", registry=r)
        self.commit_duration = Histogram(
            "icesink_commit_duration_seconds",
            "Iceberg table commit, from its first attempt to success (retries included; not the wait for a commit "
            "thread or, in a commit process, behind that process's other commits)",
            ["table"], buckets=COMMIT_BUCKETS, registry=r)
        self.commit_failures = Counter(
            "icesink_commit_failures_total", "Failed Iceberg commit attempts (retried)",
            ["table"], registry=r)
        self.snapshots_committed = Counter(
            "icesink_snapshots_committed_total", "Iceberg snapshots created", ["table"], registry=r)
        self.rows_committed = Counter(
            "icesink_rows_committed_total", "Rows committed to Iceberg", ["table"], registry=r)
        self.valid_through = Gauge(
            "icesink_valid_through_timestamp_seconds",
            "All records older than this are committed to the table", ["table"], registry=r)
        self.last_round_committed = Gauge(
            "icesink_last_round_committed_timestamp_seconds",
            "When the coordinator on this replica last completed a commit round (its start until the first)", registry=r)
        self.coordinator_active = Gauge(
            "icesink_coordinator_active", "1 on the replica running the coordinator", registry=r)
        self.control_log_refused = Gauge(
            "icesink_control_log_refused",
            "1 while the coordinator refuses to commit: the control log is not the one the tables' "
            "state came from (recreated, emptied, compacted or truncated); see /status",
            registry=r)
        self.recovered_from_tables = Counter(
            "icesink_recovered_from_tables_total",
            "Coordinator recoveries that took their state from the tables (checkpoint unreadable or truncated)",
            registry=r)
        self.coordinator_epoch = Gauge(
            "icesink_coordinator_epoch", "Epoch of the coordinator on this replica", registry=r)
        # Schema evolution (agents/evolution.py, coordinator/evolution.py).
        self.schema_proposals = Counter(
            "icesink_schema_proposals_total", "SchemaProposal events sent by this worker", ["table"], registry=r)
        self.schema_changes = Counter(
            "icesink_schema_changes_total", "Schema updates committed by the coordinator (no data file)",
            ["table"], registry=r)
        self.schema_change_failures = Counter(
            "icesink_schema_change_failures_total", "Failed schema update attempts (retried next round)",
            ["table"], registry=r)
        self.commit_retrying = Gauge(
            "icesink_commit_retrying", "1 while a table commit is failing and being retried",
            ["table"], registry=r)
        self.table_parked = Gauge(
            "icesink_table_parked",
            "1 while a table is parked: its commits kept failing, its data and the checkpoint are held for it "
            "while every other table keeps committing (see /status parked)", ["table"], registry=r)
        self.table_missing = Gauge(
            "icesink_table_missing",
            "1 while a table this worker's records go to does not exist and may not be created (dropped by another "
            "writer): the partitions with records for it are held back (see /status missing_tables)",
            ["table"], registry=r)
        self.commits_announced_late = Counter(
            "icesink_commits_announced_late_total",
            "Table commits announced (CommitToTable) by a later attempt or coordinator: the one that made the "
            "snapshot stopped before announcing it", registry=r)
        self.schema_registry_failures = Counter(
            "icesink_schema_registry_failures_total",
            "Schema-registry requests that failed (down, 5xx, timeout): retried with capped backoff while the "
            "fetch waits (see /status schema_registry)", registry=r)
        self.schema_registry_waiting = Gauge(
            "icesink_schema_registry_waiting",
            "1 while the schema registry does not answer and fetches wait for it (see /status schema_registry)",
            registry=r)
