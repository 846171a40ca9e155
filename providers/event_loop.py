"""One asyncio event loop per process, on a daemon thread, for the SDKs' async clients.

The Twilio and FCM backends keep their pooled async HTTP clients on this loop and submit coroutines
to it from the worker thread with :func:`run`, which blocks until the coroutine is done: a pooled
client is bound to its loop, so reusing keep-alive connections across batches needs a loop that
outlives a batch. Created lazily in the process that uses it; a forked child starts its own and
backends rebuild their clients on a new loop (:func:`loop_id`). docs/PROVIDERS.md, "Async SDK paths".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid: int | None = None
_generation = 0


def _running_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread, _pid, _generation
    with _lock:
        if _loop is None or _pid != os.getpid() or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="provider-io", daemon=True)
            thread.start()
            _loop, _thread, _pid = loop, thread, os.getpid()
            _generation += 1
        return _loop


def loop_id() -> tuple[int, int]:
    """``(pid, generation)`` of the loop :func:`run` uses now (starting it if needed). A client built
    for another value belongs to a dead loop (another process, or a loop before a fork)."""
    _running_loop()
    return (_pid or 0, _generation)


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on this process's loop thread and return its result (or raise its exception).

    Args:
        coro: the coroutine; it must bound its own duration (the backends' per-request timeouts).
        timeout: seconds to wait at most (a backstop), ``None`` for no limit.

    Raises:
        TimeoutError: the backstop expired; the coroutine is cancelled.
        RuntimeError: called from the loop thread itself (it would wait for itself forever).
    """
    loop = _running_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("providers.event_loop.run() called from the provider-io loop thread")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"provider call not done within {timeout} s") from None


def _forget_after_fork() -> None:
    # The loop thread does not exist in the child; never run or close the parent's loop here.
    global _loop, _thread, _pid
    _loop, _thread, _pid = None, None, None


os.register_at_fork(after_in_child=_forget_after_fork)
