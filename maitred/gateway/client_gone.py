"""Waiting on something for a client that may leave meanwhile.

A client that closes its connection while its request is held for admission, or while a worker
answers it, should cost nothing more: ``unless_gone`` drops the wait (the request is never sent,
or its connection to the worker is closed, which aborts it there) and raises ``ClientGone``.
"""

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from maitred.gateway.guard import ClientGone

T = TypeVar("T")


async def disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_gone(awaiting: Awaitable[T], receive: Receive) -> T:
    """What ``awaiting`` gives, unless the client leaves first (then it is cancelled and
    ``ClientGone`` raised): a held request whose client is gone is dropped (its program stops
    wanting the GPU, ``LiveDriver.admit``) instead of being sent to a worker when its hold ends,
    and a request the worker is answering is cut off there. What finishes at once pays one pass
    of the event loop."""
    task = asyncio.ensure_future(awaiting)
    await asyncio.sleep(0)
    if task.done():
        return task.result()
    watcher = asyncio.ensure_future(disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()  # the request itself is ended (shutdown): so is its wait for admission
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGone
