"""The platform's clock: every "now" in the delivery pipeline comes from :func:`now`.

In production it is ``django.utils.timezone.now()``. Tests (and the chaos suite) can move it for all
processes at once: when ``settings.NOTIFY["CLOCK_OFFSET_FILE"]`` names a file holding a number of
seconds, that offset is added. The file is re-read only when its mtime changes.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

_cache: dict[str, tuple[float, float]] = {}


def offset_seconds() -> float:
    """The configured clock offset in seconds (0.0 when no offset file is configured or present)."""
    path = settings.NOTIFY.get("CLOCK_OFFSET_FILE")
    if not path:
        return 0.0
    try:
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0
    cached = _cache.get(path)
    if cached and cached[0] == mtime:
        return cached[1]
    try:
        with open(path) as fh:
            value = float(fh.read().strip() or 0)
    except (OSError, ValueError):
        value = 0.0
    _cache[path] = (mtime, value)
    return value


def now() -> datetime:
    """Current instant, timezone-aware UTC, shifted by the test clock offset if one is set."""
    off = offset_seconds()
    return timezone.now() + timedelta(seconds=off) if off else timezone.now()
