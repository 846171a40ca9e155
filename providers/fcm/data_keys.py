"""Which push ``data`` keys FCM refuses, and which the platform sets itself (docs/PROVIDERS.md §3).

FCM HTTP v1 ``Message.data``: a key must not be a reserved word, ``"from"`` or ``"message_type"``,
nor start with ``"google."`` or ``"gcm."``; FCM refuses such a message at send time. Compared
case-insensitively here, to be safe. ``notification_id`` is set by
:func:`providers.fcm.backend.build_message` in every push's data: a caller's value would be
silently overwritten, so it is refused too.

Importing this module touches neither Django settings nor firebase-admin (only providers.base).
"""

from __future__ import annotations

from providers.base import NOTIFICATION_ID_KEY, platform_key_problem

__all__ = ["FCM_RESERVED_KEYS", "FCM_RESERVED_PREFIXES", "NOTIFICATION_ID_KEY", "data_key_problem"]

#: Keys FCM refuses outright.
FCM_RESERVED_KEYS = frozenset({"from", "message_type"})
#: Prefixes FCM reserves.
FCM_RESERVED_PREFIXES = ("google.", "gcm.")


def data_key_problem(key: str) -> str | None:
    """Why ``key`` may not be a push ``data`` key (a sentence naming the rule), or ``None``."""
    if not key:
        return "a data key must not be empty"
    folded = key.casefold()
    if folded in FCM_RESERVED_KEYS:
        return f"data key {key!r} is reserved by FCM (\"from\", \"message_type\", any case); use another key"
    for prefix in FCM_RESERVED_PREFIXES:
        if folded.startswith(prefix):
            return f"data key {key!r} starts with {prefix!r} (any case), a prefix FCM reserves; use another key"
    return platform_key_problem(key, "every push")
