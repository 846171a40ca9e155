"""What every provider webhook shares: the public URL a signature covers, the 403 answer, and text
made storable.

Signatures cover the URL the provider called, which behind a TLS-terminating proxy is not what
Django sees. ``settings.PUBLIC_BASE_URL`` is that public origin (scheme + host [+ port]); the path and
query come from the request. ``X-Forwarded-Proto`` is honoured only through Django's own
``SECURE_PROXY_SSL_HEADER``, i.e. only when ``TRUST_X_FORWARDED_PROTO`` is configured.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import JsonResponse

from core.vocabulary import UNSTORABLE

log = logging.getLogger(__name__)


def public_url(request) -> str:
    """The absolute URL the provider used for this request (what its signature covers)."""
    base = getattr(settings, "PUBLIC_BASE_URL", "")
    if base:
        return base.rstrip("/") + request.get_full_path()
    return request.build_absolute_uri()


def forbidden(provider: str, why: str) -> JsonResponse:
    """403 for an unsigned, forged or stale webhook. Nothing was changed."""
    log.warning("%s webhook refused: %s", provider, why)
    return JsonResponse({"error": {"status": 403, "code": "invalid_signature", "message": why}}, status=403)


REPLACEMENT = "\ufffd"


def storable(value):
    """``value`` with every NUL and lone surrogate replaced by U+FFFD when it is a string; anything
    else unchanged.

    Replaced, not stripped, and not refused: a provider retries an event it was refused (a 4xx or a
    5xx) for days, while the event itself is genuine (its signature held). Kept with the damage
    visible, it is stored once like any other; a damaged id (``"SM12\ufffd34"``) matches no message,
    where a stripped one (``"SM1234"``) could match somebody else's."""
    if isinstance(value, str) and UNSTORABLE.search(value):
        return UNSTORABLE.sub(REPLACEMENT, value)
    return value


def storable_fields(fields: dict) -> dict:
    """``fields`` (one provider event, or a callback's form parameters) with :func:`storable` keys and
    string values; nested values are left alone (nothing reads them but ``str()``, whose repr escapes)."""
    return {storable(str(key)): storable(value) for key, value in fields.items()}
