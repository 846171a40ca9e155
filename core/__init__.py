"""The ground floor: what every app shares and nothing here knows of any app.

* :mod:`core.vocabulary` — channels, tiers, the category and locale patterns.
* :mod:`core.identifiers` — the user-id and push-token rules.
* :mod:`core.queues` — the queue topology: which queue a send, a fan-out page or a receipt goes to.
* :mod:`core.redis_client` — the one Redis client and the Lua-script helper.
* :mod:`core.clock` — the platform's "now" (movable by tests for every process at once).
* :mod:`core.postgres` — Postgres array literals and ``COPY``.
* :mod:`core.redaction` — contacts and sensitive content kept out of every log record.
* :mod:`core.forms` — form fields every admin shares (a JSON field showing ``None`` as empty).
* :mod:`core.api` — the API primitives: the error shape, strict parsers and fields, id rules,
  pagination, scopes, refusals, audit notes.

A plain package, not a Django app: it has no models. The floors above it are described in
docs/ARCHITECTURE.md; ``lint-imports`` (pyproject.toml) keeps every import pointing down.
"""
