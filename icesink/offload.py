"""The one executor for blocking work: Spark jobs, catalog calls, Parquet footers, file deletes.

The event loop never waits on the JVM or the catalog: it awaits ``Offload.run``.
"""

from __future__ import annotations

import asyncio
import contextlib
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
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def settle(result: T | None, exc: BaseException | None) -> None:
            if done.done():  # the awaiting task was cancelled
                return
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(result)  # type: ignore[arg-type]

        def call() -> None:
            try:
                result, exc = fn(), None
            except BaseException as e:  # handed to the awaiting task
                result, exc = None, e
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits it
                loop.call_soon_threadsafe(settle, result, exc)

        threading.Thread(target=call, name="icesink-detached", daemon=True).start()
        return await done

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
