"""The one executor for blocking work: Spark jobs, catalog calls, Parquet footers, file deletes.

The event loop never waits on the JVM or the catalog: it awaits ``Offload.run``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Offload:
    def __init__(self, threads: int = 4) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="icesink-blocking")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def run_detached(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in a daemon thread of its own, for a call that may outlast a stop (a Spark
        session's start): the process exits without waiting for it, where a pool's thread
        would hold the exit until the call returned."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            if not done.set_running_or_notify_cancel():  # its waiter was cancelled before it began
                return
            try:
                done.set_result(fn())
            except BaseException as e:  # handed to the awaiting task
                done.set_exception(e)

        threading.Thread(target=call, name="icesink-detached", daemon=True).start()
        return await asyncio.wrap_future(done)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
