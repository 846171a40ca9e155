"""Concurrent SDK calls for providers without a batch API (Twilio, FCM): a per-process thread pool.

Each pool thread uses its own backend instance from the registry (``get_backend`` caches one per
thread), since a backend is used by one thread at a time (providers/base.py). The pool is created
once per process and size (after a fork the child builds its own), so a batch costs no thread
start-up: docs/PERFORMANCE.md ("Calibration") measured ``send_each``'s 500 fresh threads at +0.6 ms per message.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def _pool(size: int) -> ThreadPoolExecutor:
    with _lock:
        pool = _pools.get(size)
        if pool is None:
            pool = _pools[size] = ThreadPoolExecutor(max_workers=size, thread_name_prefix=f"send{size}")
        return pool


def send_concurrently(channel: str, name: str, messages: list, concurrency: int) -> list:
    """Send ``messages`` through provider ``name`` of ``channel`` with up to ``concurrency`` calls in
    flight. Returns one ``SendResult`` or exception per message, in input order (never raises for a
    message's failure)."""
    from providers.registry import get_backend

    def one(message):
        try:
            backend = get_backend(channel, name)  # this pool thread's own instance
        except Exception as exc:  # a configuration error is every message's answer
            return exc
        return backend.send_or_error(message)

    return list(_pool(concurrency).map(one, messages))


def _forget_after_fork() -> None:
    _pools.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
