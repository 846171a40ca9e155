"""The emulator's built-in account names and credentials, as the platform knows them.

They live here, beside the backends and not under ``providers/emulator/``, because production code
(``config/provider_settings.py``, ``providers/registry.py``, the Twilio webhook) needs them and must
never import the emulator itself; the emulator needs none of them (it signs receipts with whatever
credentials a client sent, docs/SECURITY.md).

They are public (they are in this repository), so they are only ever configured, and a webhook
signed with one is only ever accepted, in emulator mode (``settings.PROVIDER_MODE == "emulator"``,
see ``config/provider_settings.py``). Outside it, ``manage.py check`` refuses a provider configured
with one of :data:`BUILT_IN_SECRETS` and the Twilio webhook refuses signatures made with it.
"""

TWILIO_ACCOUNT_SID = "AC" + "0" * 32
TWILIO_BACKUP_ACCOUNT_SID = "AC" + "1" * 32
TWILIO_AUTH_TOKEN = "emulator-auth-token"  # noqa: S105 - public on purpose (docstring)
TWILIO_FROM_NUMBER = "+15005550006"
TWILIO_BACKUP_FROM_NUMBER = "+15005550007"
SENDGRID_API_KEY = "SG.emulator"
FCM_PROJECT_ID = "emulator-project"
EMAIL_FROM = "notifications@example.com"

#: Secrets anyone can read here: never valid outside emulator mode.
BUILT_IN_SECRETS = frozenset({TWILIO_AUTH_TOKEN, SENDGRID_API_KEY})
