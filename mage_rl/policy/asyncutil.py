"""Between threads and event loops: run a coroutine from synchronous code, inside or
outside a loop, and hand a worker thread's results and callbacks to a loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)


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


def threadsafe_callback(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., None]
) -> Callable[..., None]:
    """Wrap ``callback`` so that a worker thread's calls run on ``loop``, in order."""

    def call(*args: Any) -> None:
        # RuntimeError: the loop closed, so nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback, *args)

    return call


def settle_threadsafe(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[T], outcome: T | BaseException
) -> None:
    """Hand ``outcome`` (a result or the exception to raise) to ``future`` from another thread."""
    try:
        loop.call_soon_threadsafe(_settle, future, outcome)
    except RuntimeError:  # the loop closed; nobody is waiting any more
        logger.debug("dropping a response for a closed event loop")


def _settle(future: asyncio.Future[T], outcome: T | BaseException) -> None:
    """Resolve ``future`` on its loop's thread, once; later outcomes are ignored."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
