"""Whole-group restart on the embedded Tansu broker, without Spark.

Starts an embedded broker and a topic, runs N worker processes of one consumer group, then
repeatedly stops the whole group gracefully (SIGTERM) and starts N new members at once,
timing how long the new group takes to assign every partition of the topic.

Each member is the real ``agents.worker.Worker`` Faust app and group membership
(``FaustApp``, ``FaustApp.start``, ``Worker._shutdown``) with Spark, the catalog and the control topic
left out: its rebalance callbacks only report the assignment. So group behaviour matches a real
replica while a cycle costs a few seconds of CPU.

    .venv/bin/python bench/group_restart_repro.py [--cycles 10] [--members 2] [--debug]

``--leave-group`` says which stopping members send LeaveGroup: ``icesink`` (the default) as
the workers do (``agents.faust_app.install_leave_group``: every member but the group's leader on
Tansu, every member on Kafka), ``always`` (every member: on Tansu about a third of the cycles
then wait until ``--timeout-s``, the new members told to follow a leader that has left), or
``never`` (what icesink did before: a stopped member leaves when its session expires). After a
cycle times out the run goes on with a fresh group id, since the stuck group stays stuck.
``--broker kafka`` runs it on a real Apache Kafka broker (tests/support/kafka_broker.py).

``--debug`` logs aiokafka's group coordinator and Faust at DEBUG and runs Tansu with its
group coordinator at debug (``--rust-log`` sets another ``RUST_LOG``); ``--keep`` keeps the
directory with every member's log and ``tansu.log``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOPIC = "repro-src"
GROUP = "repro-sink"
MARK = "@@repro "


# Member process ------------------------------------------------------------------------------


def member_main(args: argparse.Namespace) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    levels = {"aiokafka": logging.INFO, "faust": logging.WARNING, "mode": logging.WARNING}
    if args.debug:
        levels = {"aiokafka": logging.INFO, "aiokafka.consumer.group_coordinator": logging.DEBUG,
                  "faust": logging.DEBUG, "mode": logging.INFO}
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    asyncio.run(_member(args))


def _report(kind: str, **data: Any) -> None:
    print(MARK + json.dumps({"kind": kind, "t": time.time(), **data}), flush=True)


async def _member(args: argparse.Namespace) -> None:
    from agents import faust_app
    from agents.worker import Worker
    from icesink.app.files import spark_files
    from icesink.shared.config import load_settings
    from icesink.shared.metrics import Metrics

    settings = load_settings(None, {}, {
        "topics": TOPIC, "iceberg.tables": "repro.t", "group.id": args.group,
        "bootstrap.servers": args.bootstrap, "state.dir": args.state_dir,
        "worker.id": args.name, "consumer.session-timeout-ms": args.session_timeout_ms,
        "spark.master": "local[1]",  # never started
    })

    icesink_skip = faust_app.skip_leave_group

    class _Closed:
        async def stop(self) -> None:
            pass

    class Member(Worker):
        """The real worker's Faust app and shutdown; no Spark, catalog or control topic."""

        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            own, app = self.ownership, self.app  # its receivers give way to the reports (no claims)
            for sig, real, mine in ((app.on_partitions_revoked, own.on_revoked, self._on_revoked),
                                    (app.on_partitions_assigned, own.on_assigned, self._on_assigned),
                                    (app.on_rebalance_complete, own.on_rebalance_complete, self._on_rebalance_complete)):
                sig.disconnect(real)
                sig.connect(mine)

        async def _on_revoked(self, sender: Any, revoked: set[Any], **_: Any) -> None:
            _report("revoked", partitions=sorted(t.partition for t in revoked if t.topic == TOPIC))

        async def _on_assigned(self, sender: Any, assigned: set[Any], **_: Any) -> None:
            _report("assigned", generation=self.app.consumer_generation_id,
                    partitions=sorted(t.partition for t in assigned if t.topic == TOPIC))

        async def _on_rebalance_complete(self, sender: Any, **_: Any) -> None:
            _report("rebalanced", generation=self.app.consumer_generation_id)

        async def on_events(self, batch: Any) -> None:
            pass

        @staticmethod
        def skip_leave_group(consumer: Any, leader: bool) -> str | None:
            if args.leave_group == "always":
                return None
            if args.leave_group == "never":
                return "--leave-group never"
            skip = icesink_skip(consumer, leader)
            _report("leave", leader=leader, sent=skip is None)
            return skip

        async def run(self, stop_requested: Any = None) -> None:  # Worker.run without control topic, Spark, catalog
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
            self.reader = self.producer = _Closed()
            faust_app.skip_leave_group = self.skip_leave_group  # what install_leave_group asks
            await self.faust.start()
            _report("started")
            await self._stop.wait()
            began = time.monotonic()
            await self._shutdown()
            _report("stopped", seconds=round(time.monotonic() - began, 2))

    await Member(settings, args.bootstrap, Metrics(), files=spark_files).run()


# Driver --------------------------------------------------------------------------------------


class Members:
    def __init__(self, args: argparse.Namespace, bootstrap: str, root: Path) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.root = root
        self.count = 0
        self.group = GROUP
        self.live: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}

    def start(self) -> str:
        from icesink.app.embedded import _die_with_parent_hook

        self.count += 1
        name = f"m{self.count}"
        log_path = self.root / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, __file__, "--member", name, "--group", self.group,
               "--bootstrap", self.bootstrap, "--state-dir", str(self.root / "state"),
               "--session-timeout-ms", str(self.args.session_timeout_ms)]
        if self.args.debug:
            cmd.append("--debug")
        cmd += ["--leave-group", self.args.leave_group]
        with log_path.open("ab") as handle:
            proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_die_with_parent_hook())
        self.live[name] = (proc, log_path)
        return name

    def events(self, name: str) -> list[dict[str, Any]]:
        text = self.live[name][1].read_text(errors="replace")
        return [json.loads(line[len(MARK):]) for line in text.splitlines() if line.startswith(MARK)]

    def check_alive(self) -> None:
        for name, (proc, log_path) in self.live.items():
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"member {name} exited with {proc.returncode}:\n{tail}")

    def formed(self, partitions: int) -> tuple[bool, str]:
        """Every live member has completed a rebalance of one generation and together they own
        every partition exactly once."""
        owned: list[int] = []
        generations = set()
        for name in self.live:
            evs = [e for e in self.events(name) if e["kind"] in ("assigned", "revoked", "rebalanced")]
            assigned = [e for e in evs if e["kind"] == "assigned"]
            if not assigned or evs[-1]["kind"] != "rebalanced":
                return False, f"{name}: no settled assignment"
            owned += assigned[-1]["partitions"]
            generations.add(assigned[-1]["generation"])
        ok = sorted(owned) == list(range(partitions)) and len(generations) == 1
        return ok, f"owned {sorted(owned)} generations {sorted(generations)}"

    def stop_all(self, timeout_s: float = 60.0) -> float:
        began = time.monotonic()
        for proc, _ in self.live.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.live.values():
            try:
                proc.wait(max(0.1, timeout_s - (time.monotonic() - began)))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.live.clear()
        return time.monotonic() - began


def wait_formed(members: Members, partitions: int, timeout_s: float) -> float | None:
    began = time.monotonic()
    last = ""
    while time.monotonic() - began < timeout_s:
        members.check_alive()
        ok, last = members.formed(partitions)
        if ok:
            return time.monotonic() - began
        time.sleep(0.25)
    print(f"  not formed within {timeout_s:.0f} s: {last}", flush=True)
    return None


def driver_main(args: argparse.Namespace) -> int:
    from icesink.app.embedded import EmbeddedBroker
    from icesink.shared.kafka_admin import ensure_topic

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="group-restart-"))
    root.mkdir(parents=True, exist_ok=True)
    env = {"RUST_LOG": args.rust_log} if args.rust_log else {}
    broker: Any
    if args.broker == "kafka":
        from tests.support.kafka_broker import KafkaBroker

        broker = KafkaBroker(root / "kafka")
    else:
        broker = EmbeddedBroker(root / "broker", env=env)
    broker.start()
    members = Members(args, broker.bootstrap, root)
    times: list[float | None] = []
    try:
        asyncio.run(ensure_topic(broker.bootstrap, TOPIC, args.partitions))
        print(f"broker {broker.bootstrap}, logs in {root}", flush=True)
        for _ in range(args.members):
            members.start()
        first = wait_formed(members, args.partitions, args.timeout_s)
        print(f"first group formed in {first}", flush=True)
        for cycle in range(1, args.cycles + 1):
            time.sleep(args.settle_s)
            stopped = members.stop_all()
            names = [members.start() for _ in range(args.members)]
            took = wait_formed(members, args.partitions, args.timeout_s)
            times.append(took)
            shown = "TIMEOUT" if took is None else f"{took:6.1f} s"
            print(f"cycle {cycle:2d}: old group stopped in {stopped:4.1f} s; "
                  f"new group {','.join(names)} formed in {shown}", flush=True)
            if took is None:  # a stuck group stays stuck: go on with a fresh one
                members.stop_all()
                members.group = f"{GROUP}-{cycle}"
                for _ in range(args.members):
                    members.start()
                first = wait_formed(members, args.partitions, args.timeout_s)
                print(f"fresh group {members.group} formed in {first}", flush=True)
    finally:
        members.stop_all()
        broker.stop()
        done = [t for t in times if t is not None]
        if times:
            print(f"formed {len(done)}/{len(times)}; times "
                  + " ".join("TIMEOUT" if t is None else f"{t:.1f}" for t in times)
                  + (f"; max {max(done):.1f} s" if done else ""), flush=True)
        if args.keep or args.dir:
            print(f"kept {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if times and all(t is not None for t in times) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=10)
    p.add_argument("--members", type=int, default=2)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--session-timeout-ms", type=int, default=10_000)
    p.add_argument("--settle-s", type=float, default=3.0, help="run time of a group before it is stopped")
    p.add_argument("--timeout-s", type=float, default=900.0, help="give up on a cycle after this")
    p.add_argument("--debug", action="store_true", help="DEBUG logs for aiokafka's coordinator and Faust")
    p.add_argument("--leave-group", choices=("icesink", "always", "never"), default="icesink",
                   help="which stopping members send LeaveGroup: as icesink's workers do (all but the group's "
                        "leader on Tansu, all on Kafka), every one, or none")
    p.add_argument("--broker", choices=("tansu", "kafka"), default="tansu",
                   help="the embedded Tansu broker, or a real Apache Kafka one (tests/support/kafka_broker.py)")
    p.add_argument("--rust-log", default=None, help="RUST_LOG for Tansu (default: debug with --debug)")
    p.add_argument("--dir", default=None, help="work directory (kept)")
    p.add_argument("--keep", action="store_true")
    # Member process (internal).
    p.add_argument("--member", default=None, help=argparse.SUPPRESS)
    p.add_argument("--group", default=GROUP, help=argparse.SUPPRESS)
    p.add_argument("--bootstrap", default=None, help=argparse.SUPPRESS)
    p.add_argument("--state-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.member:
        args.name = args.member
        member_main(args)
        return 0
    if args.debug and args.rust_log is None:
        # Tansu at plain "debug" logs gigabytes (every span of every fetch); its group
        # coordinator alone is enough here.
        args.rust_log = "warn,tansu_broker::coordinator::group=debug"
    return driver_main(args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
