"""The emulator's built-in account names and credentials, as the platform knows them.

Here, not under ``providers/emulator/``, because production code (``config/provider_settings.py``,
``providers/registry.py``, the Twilio webhook) needs them and must never import the emulator. They
are public, so they are only configured, and a webhook signed with one only accepted, in emulator
mode: outside it ``manage.py check`` refuses a provider configured with one of
:data:`BUILT_IN_SECRETS` and the Twilio webhook refuses its signatures (docs/SECURITY.md).
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
