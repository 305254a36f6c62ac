"""``icesink pizzas`` on a topic that exists already: a worker that subscribed first has its
consumer create the topic (with the broker's own partition count), and the README's worker
block runs ``icesink pizzas`` after it. ``--partitions`` is for a topic it creates: an existing
one is produced to over the partitions it has, every record delivered (a real broker)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_pizzas_to_a_topic_that_exists_with_other_partitions_uses_its_partitions(broker, tmp_path):
    from icesink.shared.kafka_admin import end_offsets, ensure_topic

    asyncio.run(ensure_topic(broker.bootstrap, "pizzas-cli-4", 4))
    done = subprocess.run([sys.executable, "-m", "icesink", "pizzas", "--count", "40", "--topic", "pizzas-cli-4",
                           "--bootstrap", broker.bootstrap], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ends = asyncio.run(end_offsets(broker.bootstrap, "pizzas-cli-4"))
    assert sorted(ends.values()) == [10, 10, 10, 10], ends
