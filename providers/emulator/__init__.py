"""Provider emulator: a local server speaking the real wire formats of the providers we use.

Start it with ``python -m providers.emulator`` (see ``__main__.py`` for flags and environment).
It binds 127.0.0.1 (``--host``: a test host's address) and serves, in one asyncio loop:

* Twilio Messages API (``twilio_api``), SendGrid v3 mail/send (``sendgrid_api``), FCM HTTP v1 and
  its OAuth token endpoint (``fcm_api``), over HTTP on ``--port`` (default 8900);
* an SMTP sink (``smtp_sink``) on ``--smtp-port`` (default 8925);
* an inspection and fault-injection API under ``/_emulator/`` (``inspection``, ``faults``), with
  fault rules per provider, destination or account (Twilio AccountSid, FCM project), and a benchmark
  summary of everything received, ``POST /_emulator/analysis`` (counts per provider and account,
  duplicate notification ids, arrival times, per-bucket rates; run with ``EMULATOR_MAX_MESSAGES=0``
  so the in-memory store keeps every message);
* delivery receipts sent back like the real providers do: signed Twilio status callbacks and SendGrid
  Event Webhook batches (``receipts`` decides what, ``webhooks`` sends, ``signing`` signs), to
  loopback URLs only.

The unmodified SDKs are pointed at it through the hooks in ``docs/PROVIDERS.md``, so they
parse its answers and raise their real exception classes. Accepted messages are recorded
(``store``); rejected ones are only counted. Nothing here imports Django.
"""
