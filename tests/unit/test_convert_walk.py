"""Issue 41 point 7: a batch's decode walks agents/convert/ and agents/formats/ one way.

tests/support/rooms.py traces the representative batches (JSON tutorial records, a nested record,
a schema'd Connect JSON record, a Debezium envelope) through the public entries and records the
modules ("rooms") entered. Two rules:

- no upcall: at run time no room calls a room above it in the order of agents/convert/__init__.py's
  docstring (leaves, wrapped, plan, vectorised, reference, inference, decoder, the package; then
  agents/formats/), callbacks and generators included, which the import rule cannot see;
- returns (re-entering, within one call of a public entry, a room left before) do not grow past
  today's figures. What is left is the decoder going back to wrapped to read after the package
  wrapped the values, and vectorised using its leaves (columns, arrays) in turn, a struct field
  after another; lower a ceiling when a change lowers the figure.
"""

from __future__ import annotations

import pytest

from tests.support.rooms import batches, walk

#: Returns measured on 2026-11-29 (issue 41 point 7: 26, 32, 30 and 48 before the plan built its
#: parse schema once, vectorised converted a struct's columns before their masks, the decoder took
#: a batch in one call and with_extras checked types without an empty decode); a ratchet.
RETURNS_CEILING = {"tutorial": 5, "nested": 7, "connect": 4, "debezium-envelope": 12}


@pytest.mark.parametrize("name", sorted(RETURNS_CEILING))
def test_a_decode_never_calls_a_room_above_the_caller(name: str) -> None:
    w, result = walk(batches()[name])
    assert result.table.num_rows == 50 and not result.rejects, result.rejects
    assert w.upcalls == [], f"{name}: calls from a lower room into a higher one: {sorted(set(w.upcalls))}"


@pytest.mark.parametrize("name", sorted(RETURNS_CEILING))
def test_a_decode_returns_to_rooms_no_more_than_today(name: str) -> None:
    w, _ = walk(batches()[name])
    walked = " > ".join(r.removeprefix("agents.") for r in w.rooms)
    assert len(w.returns) <= RETURNS_CEILING[name], \
        f"{name}: {len(w.returns)} returns (ceiling {RETURNS_CEILING[name]}) in {w.stops} stops:\n{walked}"
