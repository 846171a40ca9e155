"""Provider backends (Twilio, SendGrid, SMTP, FCM), their registry and a local provider emulator.

* ``providers.base``: the contract (``OutboundMessage``, ``SendResult``, the error hierarchy).
* ``providers.<name>.backend``: one backend per provider, built on the provider's own SDK.
* ``providers.registry``: ``get_backend(channel, name)`` from ``settings.PROVIDERS``.
* ``providers.emulator``: ``python -m providers.emulator``, a local server speaking the providers'
  wire formats (see ``docs/PROVIDERS.md``).

Importing this package is cheap and touches neither Django settings nor any SDK.
"""
