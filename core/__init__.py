"""The ground floor: what every app shares and nothing here knows of any app.

Channels, tiers and patterns (vocabulary), id rules (identifiers), the queue topology (queues), the
Redis client (redis_client), the platform's "now" (clock), Postgres helpers, log redaction, shared
admin form fields, and the API primitives (api/). A plain package, not a Django app: no models.
The module list: docs/ARCHITECTURE.md §12; the floors, kept by ``lint-imports``: §3.
"""
