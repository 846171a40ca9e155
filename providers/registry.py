"""Provider registry: build backends from ``settings.PROVIDERS`` and cache them per thread.

``settings.PROVIDERS`` maps a channel to an ordered list of provider entries, the primary first
(``{"NAME", "BACKEND", "OPTIONS", …}``, built by config/provider_settings.py). Backends are imported
lazily (``import_string``) and one opened instance is kept per (process, thread, channel, name): a
backend is used by one thread at a time (providers/base.py), and connections must not be shared
across a fork.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from core.vocabulary import PROVIDER_CHANNELS
from providers.base import ProviderBackend, ProviderConfigurationError
from providers.emulator_credentials import BUILT_IN_SECRETS

logger = logging.getLogger(__name__)


_local = threading.local()
#: Bumped by reset_backends(); a thread whose cache is older closes and drops it on next use.
_generation = 0
#: Every backend this process opened, in any thread (by id: backends are unhashable dataclasses),
#: so that :func:`close_all_backends` reaches the caches of a threaded worker's pool threads too.
_opened: dict[int, ProviderBackend] = {}
_opened_lock = threading.Lock()


#: The setting that lists each channel's providers (config/provider_settings.py).
_LIST_VARIABLES = {"sms": "SMS_PROVIDERS", "email": "EMAIL_PROVIDERS", "push": "PUSH_PROVIDERS"}


def provider_names(channel: str) -> list[str]:
    """Configured provider names for ``channel``, primary first.

    Raises:
        ProviderConfigurationError: ``settings.PROVIDERS[channel]`` is missing or empty (code
            ``not_configured``, the message of :func:`unavailable_channel_problem`).
    """
    return [entry["NAME"] for entry in _entries(channel)]


def unavailable_channel_problem(channel: str) -> str:
    """Why nothing can be sent on ``channel``, or ``''`` when it has a provider: ``'no push provider is
    configured (PUSH_PROVIDERS is empty; settings.PROVIDERS["push"] lists none): nothing is sent on
    push'``; always ``''`` for ``in_app`` (no provider). A deployment without a channel
    sets its list empty; sends on it are refused when made (API 422 ``channel_unavailable``, the
    admin's campaign form) and a row accepted before fails as a dead letter with this reason."""
    providers = getattr(settings, "PROVIDERS", None) or {}
    if channel not in PROVIDER_CHANNELS:
        return ""  # in_app: written to the inbox, no provider (notifications/inbox)
    if isinstance(providers, dict) and providers.get(channel):
        return ""
    variable = _LIST_VARIABLES.get(channel, f'settings.PROVIDERS["{channel}"]')
    return (f'no {channel} provider is configured ({variable} is empty; settings.PROVIDERS["{channel}"] lists none): '
            f"nothing is sent on {channel}")


def get_backend(channel: str, name: str | None = None, tier: str = "standard") -> ProviderBackend:
    """Return this thread's opened backend for ``channel`` (``name=None``: the primary provider).

    ``tier="high"`` gets an instance whose TIMEOUT is at most ``settings.PROVIDER_TIMEOUT_SECONDS_HIGH``
    (an OTP waits on a slow provider only that long; the breaker then fails it over). The instance's
    ``name`` is the entry's NAME (two accounts of one provider are two names).

    Raises:
        ProviderConfigurationError: the channel or name is not in ``settings.PROVIDERS``, the
            BACKEND cannot be imported, or the backend's ``open()`` rejects its OPTIONS.
    """
    entries = _entries(channel)
    if name is None:
        entry = entries[0]
    else:
        entry = next((e for e in entries if e.get("NAME") == name), None)  # type: ignore[arg-type]
        if entry is None:
            raise ProviderConfigurationError(
                name, f'settings.PROVIDERS["{channel}"] has no provider named "{name}"',
                code="not_configured",
            )
    cache = _thread_cache()
    tier = "high" if tier == "high" else "standard"
    key = (channel, entry["NAME"], tier)
    backend = cache.get(key)
    if backend is None:
        backend = _build(channel, entry)
        if tier == "high":
            high = float(getattr(settings, "PROVIDER_TIMEOUT_SECONDS_HIGH", 0) or 0)
            current = float(backend.options.get("TIMEOUT") or high or 0)
            if high and current:
                backend.options["TIMEOUT"] = min(current, high)
        backend.open()
        cache[key] = backend
        with _opened_lock:
            _opened[id(backend)] = backend
    return backend


def reset_backends() -> None:
    """Close and drop this thread's cached backends; other threads drop theirs on their next use.

    Used by tests and after settings change. After a fork the child forgets (without closing) the
    instances inherited from the parent, whose sockets it must not touch.
    """
    global _generation
    _generation += 1
    _close_all(getattr(_local, "backends", {}).values())
    _local.backends = {}
    _local.generation = _generation
    _local.pid = os.getpid()


def close_all_backends() -> None:
    """Close every backend this process opened, in every thread, their pooled aiohttp sessions
    included: at worker shutdown (``config/celery.py``), once no task runs any more. Unclosed, the
    sessions are collected at exit and aiohttp logs ``ERROR Unclosed client session`` for each.
    Every thread's cache becomes stale: a later :func:`get_backend` builds anew."""
    global _generation
    _generation += 1
    with _opened_lock:
        backends = list(_opened.values())
    _close_all(backends)


def check_providers_configured() -> list[str]:
    """Validate ``settings.PROVIDERS`` without opening any connection.

    Besides the shape (NAME, BACKEND, OPTIONS, the backend's required options), a real entry with
    ``ENV`` (config/provider_settings.py) is reported by the empty variables' names, and outside
    emulator mode no option may hold an emulator built-in secret. An empty list is a channel without
    a provider (``PUSH_PROVIDERS=``), not a problem.

    Returns:
        Human-readable problems (empty when fine), e.g.
        ``'settings.PROVIDERS["sms"][1] "twilio_backup": TWILIO_BACKUP_AUTH_TOKEN is not set (…)'``.
    """
    providers = getattr(settings, "PROVIDERS", None)
    if not isinstance(providers, dict):
        return ["settings.PROVIDERS is missing or not a dict of channel -> list of providers"]
    problems = [f'settings.PROVIDERS["{c}"]: unknown channel (expected one of {", ".join(PROVIDER_CHANNELS)})'
                for c in providers if c not in PROVIDER_CHANNELS]
    for channel in PROVIDER_CHANNELS:
        entries = providers.get(channel)
        where = f'settings.PROVIDERS["{channel}"]'
        if not isinstance(entries, (list, tuple)):
            problems.append(f"{where}: needs a list of providers (empty: none for this channel)")
            continue
        seen: set[str] = set()
        for index, entry in enumerate(entries):
            problems.extend(_check_entry(channel, f"{where}[{index}]", entry, seen))
    return problems


def _check_entry(channel: str, where: str, entry: Any, seen: set[str]) -> list[str]:
    if not isinstance(entry, dict):
        return [f"{where}: must be a dict with NAME, BACKEND and OPTIONS"]
    problems = []
    name = entry.get("NAME")
    if not name:
        problems.append(f"{where}: NAME is missing")
    elif name in seen:
        problems.append(f'{where}: NAME "{name}" appears twice')
    seen.add(name)  # type: ignore[arg-type]
    options = entry.get("OPTIONS", {})
    if not isinstance(options, dict):
        problems.append(f"{where}: OPTIONS must be a dict")
        options = {}
    try:
        cls = import_string(entry.get("BACKEND") or "")
    except ImportError as exc:
        return [*problems, f'{where}: BACKEND "{entry.get("BACKEND")}" cannot be imported ({exc})']
    if not (isinstance(cls, type) and issubclass(cls, ProviderBackend)):
        return [*problems, f"{where}: BACKEND {entry['BACKEND']} is not a ProviderBackend subclass"]
    if cls.channel != channel:
        problems.append(f"{where}: BACKEND {entry['BACKEND']} serves channel {cls.channel!r}, not {channel!r}")
    variables = entry.get("ENV") if isinstance(entry.get("ENV"), dict) else {}
    unset = [var for option, var in variables.items() if options.get(option) in (None, "")  # type: ignore[union-attr]
             and entry.get("MODE") != "emulator"]
    if unset:
        problems.append(f'{where} "{name}": {", ".join(unset)} {"is" if len(unset) == 1 else "are"} not set '
                        f"(a provider in real mode needs its own credentials; the emulator's are only "
                        f"used with PROVIDER_MODE=emulator)")
    missing = [k for k in getattr(cls, "required_options", ()) if options.get(k) in (None, "")
               and k not in variables]  # type: ignore[operator]
    if missing:
        problems.append(f"{where}: OPTIONS misses {', '.join(missing)}")
    if getattr(settings, "PROVIDER_MODE", "real") != "emulator":
        for option, given in options.items():
            if isinstance(given, str) and given in BUILT_IN_SECRETS:
                problems.append(f'{where} "{name}": {variables.get(option, option)} is the emulator\'s public '  # type: ignore[union-attr]
                                f"built-in credential, which only PROVIDER_MODE=emulator accepts")
    return problems


def _entries(channel: str) -> list[dict]:
    providers = getattr(settings, "PROVIDERS", None) or {}
    entries = providers.get(channel) if isinstance(providers, dict) else None
    if not entries:
        raise ProviderConfigurationError(channel, unavailable_channel_problem(channel), code="not_configured")
    return list(entries)


def _build(channel: str, entry: dict) -> ProviderBackend:
    name = entry.get("NAME") or "?"
    try:
        cls = import_string(entry["BACKEND"])
    except (KeyError, ImportError) as exc:
        raise ProviderConfigurationError(
            name, f'settings.PROVIDERS["{channel}"] entry "{name}": BACKEND cannot be imported ({exc})',
            code="not_configured",
        ) from exc
    backend = cls(options=dict(entry.get("OPTIONS") or {}))
    if entry.get("NAME") and entry["NAME"] != cls.name:
        backend.name = entry["NAME"]  # instance attribute shadows the class's provider name
    return backend


def _thread_cache() -> dict[tuple[str, str, str], ProviderBackend]:
    pid = os.getpid()
    if getattr(_local, "pid", None) != pid:
        # Fresh thread, or inherited across fork: never close the parent's connections.
        _local.backends = {}
        _local.generation = _generation
        _local.pid = pid
    elif _local.generation != _generation:
        _close_all(_local.backends.values())
        _local.backends = {}
        _local.generation = _generation
    return _local.backends


def _close_all(backends: Iterable[ProviderBackend]) -> None:
    for backend in list(backends):
        with _opened_lock:
            _opened.pop(id(backend), None)
        try:
            backend.close()
        except Exception:  # closing must never mask the caller's work
            logger.warning("closing provider backend %s failed", backend.name, exc_info=True)


def _forget_after_fork() -> None:
    _opened.clear()  # the parent's: never closed here (their sessions and sockets are the parent's)
    _local.backends = {}
    _local.generation = _generation
    _local.pid = os.getpid()


os.register_at_fork(after_in_child=_forget_after_fork)
