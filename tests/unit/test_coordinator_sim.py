"""bench/coordinator_sim.py builds a valid round: the pure state machine answers it and plans
every table's files; the events of a round grow with workers x tables, not with partitions."""

from __future__ import annotations

from bench.coordinator_sim import run_round


def test_a_small_simulated_round_is_answered_and_planned_whole():
    f = run_round(workers=3, partitions=12, tables=4, files_per_table=2)
    assert f.events == {"StartCommit": 1, "DataWritten": 3 * 4, "DataComplete": 3}
    assert f.planned_tables == 4 and f.planned_files == 3 * 4 * 2
    assert f.control_bytes > 0 and f.largest_event[1] > 0


def test_partitions_do_not_add_events():
    few, many = run_round(3, 3, 4), run_round(3, 300, 4)
    assert few.events == many.events
