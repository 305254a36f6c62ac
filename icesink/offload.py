"""The one executor for blocking work: Spark jobs, catalog calls, Parquet footers, file deletes.

The event loop never waits on the JVM or the catalog: it awaits ``Offload.run``.
"""

from __future__ import annotations

import asyncio
import functools
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

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
