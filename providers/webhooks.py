"""What every provider webhook shares: the public URL a signature covers, and the 403 answer.

Signatures cover the URL the provider called, which behind a TLS-terminating proxy is not what
Django sees. ``settings.PUBLIC_BASE_URL`` is that public origin (scheme + host [+ port]); the path and
query come from the request. ``X-Forwarded-Proto`` is honoured only through Django's own
``SECURE_PROXY_SSL_HEADER``, i.e. only when ``TRUST_X_FORWARDED_PROTO`` is configured.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import JsonResponse

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
