"""``icesink connect``'s group membership without a broker: the leader's placement, the member
metadata and assignments through aiokafka's own wire structs, and the leader's rejoin when the
connectors change (icesink/app/connect_group.py)."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocol

from icesink.app.connect_group import PROTOCOL, ConnectAssignor, Member, Membership, place
from icesink.app.connect_state import Placement, assign


def _meta(worker: str, token: str = "t") -> bytes:
    return Member(worker, f"http://{worker}", token).encode()


def test_the_leader_places_every_task_and_every_member_receives_the_whole_placement():
    members = {"m-2": _meta("b:1"), "m-1": _meta("a:1"), "m-3": _meta("c:1")}
    out = place(members, {"pizzas": 6, "orders": 1, "stopped": 0}, "leader-token")
    assert set(out) == set(members) and len(set(out.values())) == 1
    p = Placement.decode(out["m-1"])
    assert p.workers == {"a:1": "http://a:1", "b:1": "http://b:1", "c:1": "http://c:1"}
    assert p.tasks["pizzas"] == assign("pizzas", 6, ["a:1", "b:1", "c:1"])
    assert sorted(p.tasks["pizzas"]) == ["a:1", "a:1", "b:1", "b:1", "c:1", "c:1"]
    assert p.tasks["stopped"] == [] and p.connectors["orders"] == p.tasks["orders"][0]
    assert p.layout == {"pizzas": 6, "orders": 1, "stopped": 0} and p.leader == "leader-token"
    assert p.owners("pizzas", 4) == p.tasks["pizzas"][:4]


def test_tasks_the_leader_has_not_placed_are_placed_by_its_rule_over_its_members():
    """Until the rebalance the leader asks for (and on Tansu, whose rejoin without a member
    change hands back the previous assignment, for good) every member agrees on new tasks."""
    members = ["a:1", "b:1", "c:1"]
    p = Placement.decode(place({m: _meta(m) for m in members}, {"pizzas": 2}, "t")["a:1"])
    assert p.owners("pizzas", 5) == assign("pizzas", 5, members)
    assert p.owners("pizzas", 5)[:2] == p.tasks["pizzas"]
    assert p.owners("new", 2) == assign("new", 2, members) and p.connector_owner("new") == assign("new", 1, members)[0]
    assert Placement().owners("new", 2) == [None, None] and Placement().connector_owner("new") is None


def test_a_member_restarted_under_the_same_id_is_one_worker_and_an_unreadable_one_runs_nothing(caplog):
    out = place({"old": _meta("a:1", "t1"), "new": _meta("a:1", "t2"), "odd": b"\x00junk"}, {"c": 2}, "t2")
    p = Placement.decode(out["odd"])
    assert p.workers == {"a:1": "http://a:1"} and p.tasks == {"c": ["a:1", "a:1"]}
    assert "connect group member odd" in caplog.text


@pytest.mark.parametrize("data", [b"", b"{}", b"[1]", b'{"workers": 1}', b"\xff"])
def test_an_assignment_that_is_not_a_placement_is_refused(data):
    with pytest.raises(ValueError, match="not a connect group placement"):
        Placement.decode(data)


def test_metadata_and_assignments_cross_aiokafkas_wire_structs():
    placed: list[Placement] = []
    layout = {"c": 3}
    me = Member("a:1", "https://a:1", "tok")
    assignor = ConnectAssignor(me, lambda: dict(layout), placed.append)
    assert assignor.name == PROTOCOL
    wire = assignor.metadata({"configs"}).encode()
    other = ConnectAssignor(Member("b:1", "http://b:1", "x"), dict, placed.append).metadata({"configs"}).encode()
    members = {"m-a": ConsumerProtocol.METADATA.decode(wire), "m-b": ConsumerProtocol.METADATA.decode(other)}
    assert Member.decode(members["m-a"].user_data) == me and members["m-a"].subscription == ["configs"]
    assignments = assignor.assign(None, members)
    assert set(assignments) == {"m-a", "m-b"}
    for member_id, a in assignments.items():
        received = ConsumerProtocol.ASSIGNMENT.decode(a.encode())
        assert received.partitions() == [], member_id  # the config topic is read by every process itself
        assignor.on_assignment(received)
    assert len(placed) == 2 and placed[0] == placed[1]
    assert placed[0].workers == {"a:1": "https://a:1", "b:1": "http://b:1"} and placed[0].leader == "tok"
    assert sorted(placed[0].tasks["c"]) in (["a:1", "a:1", "b:1"], ["a:1", "b:1", "b:1"])


def test_an_assignment_without_a_placement_keeps_the_last_one(caplog):
    placed: list[Placement] = []
    assignor = ConnectAssignor(Member("a:1", "http://a:1", "tok"), dict, placed.append)
    assignor.on_assignment(ConsumerProtocol.ASSIGNMENT.decode(
        ConsumerProtocol.ASSIGNMENT(0, [], b"range-assignor-data").encode()))
    assert placed == [] and "keeping the last one" in caplog.text


class _Coordinator:
    def __init__(self) -> None:
        self.rejoins = 0

    def request_rejoin(self) -> None:
        self.rejoins += 1


class _Consumer:
    def __init__(self) -> None:
        self._coordinator = _Coordinator()


def _member(consumer: Any) -> Membership:
    m = Membership("a:1", "http://a:1", "g", "configs", 10, 1)
    m._consumer = consumer
    return m


def test_the_leader_asks_for_a_rebalance_once_when_the_connectors_tasks_change():
    consumer = _Consumer()
    m = _member(consumer)
    m.follow({"c": 1})
    assert consumer._coordinator.rejoins == 0  # nothing placed yet: not the leader
    m._placed(Placement.compute({"a:1": "http://a:1"}, {"c": 1}, m.me.token))
    assert m.leader
    m.follow({"c": 1})
    assert consumer._coordinator.rejoins == 0  # as placed
    m.follow({"c": 2})
    m.follow({"c": 2})
    assert consumer._coordinator.rejoins == 1  # asked once for that layout
    m.follow({"c": 2, "d": 1})
    assert consumer._coordinator.rejoins == 2
    m._placed(Placement.compute({"a:1": "http://a:1"}, {"c": 2, "d": 1}, m.me.token))
    m.follow({"c": 2, "d": 1})
    assert consumer._coordinator.rejoins == 2


def test_a_follower_never_asks_for_a_rebalance():
    consumer = _Consumer()
    m = _member(consumer)
    m._placed(Placement.compute({"a:1": "http://a:1", "b:1": "http://b:1"}, {"c": 1}, "someone-else"))
    assert not m.leader
    m.follow({"c": 5})
    assert consumer._coordinator.rejoins == 0


def test_a_session_not_set_is_six_seconds_where_the_broker_holds_joins(caplog):
    """Tansu holds every JoinGroup for half the session (agents/kafka/group.py holds_joins): a
    connect process that did not set ``session.timeout-ms`` joins with 6 s there, unless its
    heartbeats would then come less than three times a session."""
    caplog.set_level("INFO")
    m = Membership("w1", "http://w1", "g", "configs", session_s=10.0, heartbeat_s=2.0)
    m.fit_session(holds_joins=False, session_set=False)
    assert m.session_s == 10.0
    m.fit_session(holds_joins=True, session_set=True)
    assert m.session_s == 10.0
    m.fit_session(holds_joins=True, session_set=False)
    assert m.session_s == 6.0
    assert "session.timeout-ms is 6000 ms here" in caplog.text
    slow = Membership("w1", "http://w1", "g", "configs", session_s=10.0, heartbeat_s=2.5)
    slow.fit_session(holds_joins=True, session_set=False)
    assert slow.session_s == 10.0  # heartbeat.interval-ms 2500: 6 s would leave two heartbeats a session


def test_the_settings_say_whether_the_session_was_set():
    from icesink.app.connect_settings import connect_settings

    assert not connect_settings({}).session_set
    assert connect_settings({"session.timeout-ms": 10000}).session_set
