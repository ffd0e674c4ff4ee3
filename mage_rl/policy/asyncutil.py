"""Run a coroutine to completion from synchronous code, inside or outside an event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` and return its result.

    Outside an event loop this is ``asyncio.run``. Inside one (a notebook, a LangGraph sync
    node called from async code) ``asyncio.run`` would refuse, so the coroutine runs in a
    fresh loop on a helper thread while the caller blocks.

    Args:
        coro: The coroutine to run.

    Returns:
        Its result; its exception propagates.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
