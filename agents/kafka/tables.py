"""Faust's table manager without its start-up wait for tables.

``faust.tables.TableManager.on_start`` sleeps a second so that tables can still be registered
before it finalizes them. icesink registers no Faust table (a replica's state is the Iceberg
snapshot and the control topic), so that second only delayed each replica's start and every
failover's group join. :class:`TablelessManager` goes straight to what Faust does after the
wait; should a table ever be registered, it is Faust's own start again. The app takes it through
Faust's documented ``TableManager`` setting (agents/faust_app.py).

Pinned to faust-streaming 0.15.3's ``TableManager`` (``_update_channels``, ``recovery``);
agents/kafka/versions.py checks the pin at start-up.
"""

from __future__ import annotations

from faust.tables import TableManager


class TablelessManager(TableManager):
    """A TableManager that starts at once when no table is registered."""

    async def on_start(self) -> None:
        if len(self):  # a Faust table: keep Faust's wait for the rest to register
            await super().on_start()
            return
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()
