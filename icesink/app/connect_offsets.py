"""A connector's committed offsets, as Kafka Connect's ``GET /connectors/{name}/offsets`` shows a
sink's: read from the tables, not from a consumer group.

icesink's consumer offsets are not the truth of what is committed: every Iceberg commit carries
its sink group's per-partition positions (the table property ``icesink.<group>.state``, else the
snapshot summaries: :func:`icesink.shared.iceberg.latest_sink_summary`), and recovery resumes
from them (:func:`coordinator.recovery.table_positions`: the newest state by control watermark
wins). A position is the next offset to consume, as a Kafka committed offset is.
"""

from __future__ import annotations

from typing import Any

from icesink.shared.config import Settings


def committed_offsets(settings: Settings) -> list[dict[str, Any]]:
    """Connect's sink offsets (``partition``: ``kafka_topic``, ``kafka_partition``;
    ``offset``: ``kafka_offset``) of the sink group of ``settings``, over its configured tables
    and the tables its newest rounds name (routed tables). Blocking (catalog reads)."""
    from pyiceberg.exceptions import NoSuchTableError

    from coordinator.recovery import table_positions
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
    positions = table_positions(states)
    return [{"partition": {"kafka_topic": tp.topic, "kafka_partition": tp.partition}, "offset": {"kafka_offset": off}}
            for tp, off in sorted(positions.items(), key=lambda item: (item[0].topic, item[0].partition))]
