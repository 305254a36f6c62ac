"""agents/mirror.py: a round's change rows collapsed by key (mirror tables, the worker's half),
checked case by case and against a dict model fed the same operations one by one."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.mirror import collapse

OP = "_cdc.op"


def changes(*rows: tuple) -> pa.Table:
    """Rows (id, value, op) with the operation nested in a ``_cdc`` struct, as the Debezium
    transform makes them."""
    return pa.table({
        "id": pa.array([r[0] for r in rows], pa.int64()),
        "v": pa.array([r[1] for r in rows], pa.string()),
        "_cdc": pa.array([{"op": r[2]} for r in rows], pa.struct([("op", pa.string())])),
    })


def result(c) -> tuple[dict[int, str], set[int]]:
    return dict(zip(c.rows.column("id").to_pylist(), c.rows.column("v").to_pylist())), set(
        c.deleted_keys.column("id").to_pylist())


def test_changes_of_a_key_collapse_to_the_last_and_say_which_committed_rows_go():
    c = collapse(changes((1, "a", "I"), (1, "b", "U"), (2, "c", "I"), (2, None, "D"), (3, None, "D"), (4, "d", "r")),
                 ["id"], OP, upsert=True)
    rows, deleted = result(c)
    assert rows == {1: "b", 4: "d"}
    assert deleted == {1, 2, 3, 4}  # upsert: every key touched replaces its committed row
    assert c.rows.column("_cdc").to_pylist() == [{"op": "U"}, {"op": "r"}]  # the latest change
    assert not c.rejects


def test_without_upsert_an_insert_keeps_the_committed_row_unless_the_round_deleted_it():
    c = collapse(changes((5, "new", "c"), (6, None, "d"), (6, "again", "c"), (7, "x", "u")), ["id"], OP, upsert=False)
    rows, deleted = result(c)
    assert rows == {5: "new", 6: "again", 7: "x"}
    assert deleted == {6, 7}  # 5 is only inserted; 6 was deleted before its re-insert; 7 updated


def test_a_primary_key_change_deletes_the_old_key_and_writes_the_new_one():
    c = collapse(changes((1, None, "D"), (10, "moved", "C")), ["id"], OP, upsert=False)
    assert result(c) == ({10: "moved"}, {1})


def test_rows_come_in_the_order_of_their_last_change():
    c = collapse(changes((3, "a", "I"), (1, "b", "I"), (3, "c", "U")), ["id"], OP, upsert=True)
    assert c.rows.column("id").to_pylist() == [1, 3]


def test_changes_without_a_key_or_an_operation_are_rejects_naming_the_field():
    t = changes((None, "a", "I"), (2, "b", None), (3, "c", ""), (4, "d", "U"))
    c = collapse(t, ["id"], OP, upsert=True)
    assert [(r.index, r.field) for r in c.rejects] == [(0, "id"), (1, OP), (2, OP)]
    assert "key column id" in c.rejects[0].reason and "no operation" in c.rejects[1].reason
    assert result(c) == ({4: "d"}, {4})


def test_a_key_of_several_columns():
    t = pa.table({"a": [1, 1, 1], "b": ["x", "y", "x"], "v": [1, 2, 3], "op": ["I", "I", "D"]})
    c = collapse(t, ["a", "b"], "op", upsert=False)
    assert c.rows.select(["a", "b", "v"]).to_pylist() == [{"a": 1, "b": "y", "v": 2}]
    assert c.deleted_keys.to_pylist() == [{"a": 1, "b": "x"}]


def test_settings_that_cannot_work_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="key columns"):
        collapse(changes((1, "a", "I")), [], OP, upsert=True)
    with pytest.raises(ValueError, match="'missing'"):
        collapse(changes((1, "a", "I")), ["missing"], OP, upsert=True)
    with pytest.raises(ValueError, match="'_cdc.kind'"):
        collapse(changes((1, "a", "I")), ["id"], "_cdc.kind", upsert=True)


def test_an_empty_round():
    c = collapse(changes(), ["id"], OP, upsert=True)
    assert c.rows.num_rows == 0 and c.deleted_keys.num_rows == 0 and not c.rejects


operations = st.lists(st.tuples(st.integers(0, 6), st.sampled_from(["I", "U", "D", "c", "r", "u", "d"]),
                                st.integers(0, 1000)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(committed=st.dictionaries(st.integers(0, 6), st.integers(0, 1000), max_size=5), ops=operations)
def test_collapsed_rounds_applied_to_a_table_equal_the_changes_applied_one_by_one(committed, ops):
    model = {k: str(v) for k, v in committed.items()}
    for key, op, value in ops:
        if op.upper() == "D":
            model.pop(key, None)  # a delete of an absent key does nothing
        else:
            model[key] = str(value)  # upsert mode: an insert of an existing key replaces it
    c = collapse(changes(*[(k, None if o.upper() == "D" else str(v), o) for k, o, v in ops]), ["id"], OP, upsert=True)
    rows, deleted = result(c)
    table = {k: str(v) for k, v in committed.items() if k not in deleted}
    assert not set(rows) & set(table)  # no key twice
    table.update(rows)
    assert table == model


def test_screen_moves_changes_without_key_or_operation_to_the_rejects_by_input_index():
    """As records arrive: a mirror table's changes that cannot be applied are rejects (dead
    letters, with the field named) and the rest of the batch flows."""
    import numpy as np

    from agents.convert import Converted, Reject
    from agents.mirror import screen

    rows = changes((1, "a", "c"), (None, "b", "u"), (3, "c", None), (4, "d", "d"))
    before = Converted(rows, pa.array(np.array([0, 2, 5, 6], dtype=np.int64)), (Reject(1, "not JSON", None),))
    out = screen(before, ["id"], OP)
    assert out.table.column("id").to_pylist() == [1, 4]
    assert out.indices.to_pylist() == [0, 6]
    assert [(r.index, r.field) for r in out.rejects] == [(1, None), (2, "id"), (5, OP)]
    assert "key column id" in out.rejects[1].reason and "holds no operation" in out.rejects[2].reason
    out.validate()
    every_insert = screen(before, ["id"], None)  # upsert mode without a change field: all inserts
    assert every_insert.table.num_rows == 3
    with pytest.raises(ValueError, match="operation field 'nope'"):
        screen(before, ["id"], "nope")
