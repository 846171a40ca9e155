"""The emulator's clock: the host's time plus the test clock offset the platform's processes use.

A test that moves the platform clock (``CLOCK_OFFSET_FILE``, read by ``core/clock.py``) moves the
emulator's with it, so the events it stamps (SendGrid ``timestamp``, the app's ``opened`` ``at``) and
the local hour the engagement model sees are those of the moved clock. The file holds a number of
seconds and is re-read only when its mtime changes; no file (or no path) means no offset. This module
mirrors ``core/clock.py`` because the emulator imports no Django.
"""

from __future__ import annotations

import os
import time


class OffsetClock:
    """``now()``: unix seconds, shifted by the offset in ``path`` (``None``: the host's time)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or None
        self._mtime: float | None = None
        self._offset = 0.0

    @classmethod
    def from_env(cls) -> OffsetClock:
        return cls(os.environ.get("CLOCK_OFFSET_FILE") or None)

    def offset(self) -> float:
        if self.path is None:
            return 0.0
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            return 0.0
        if mtime != self._mtime:
            try:
                with open(self.path) as fh:
                    self._offset = float(fh.read().strip() or 0)
            except (OSError, ValueError):
                self._offset = 0.0
            self._mtime = mtime
        return self._offset

    def now(self) -> float:
        return time.time() + self.offset()
