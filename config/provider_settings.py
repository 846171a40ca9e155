"""``settings.PROVIDERS`` built from the environment, in one of two explicit provider modes.

``emulator`` (the default when ``NOTIFY_ENV=local``: a checkout): the local provider emulator with
its public built-in credentials for every provider without its own. ``real`` (the default
elsewhere): no built-in credential is ever used, and a listed provider without its variables fails
``manage.py check`` naming each. Explicit because a per-variable guess once filled a missing backup
account with the emulator's public token (docs/SECURITY.md). Every entry is ``{"NAME", "BACKEND",
"OPTIONS", "MODE", "ENV": {option: variable}}``; ``ENV`` names each credential's variable (for the
check and ``manage.py doctor``). The variables: docs/OPERATIONS.md, "Configuration".
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from providers import emulator_credentials as emu_defaults

MODES = ("emulator", "real")

TWILIO = "providers.twilio.backend.TwilioSmsBackend"
SENDGRID = "providers.sendgrid.backend.SendGridEmailBackend"
SMTP = "providers.smtp.backend.SmtpEmailBackend"
FCM = "providers.fcm.backend.FcmPushBackend"

#: Variables each provider's credential options come from (the ones a real provider needs).
ENV = {
    "twilio": {"ACCOUNT_SID": "TWILIO_ACCOUNT_SID", "AUTH_TOKEN": "TWILIO_AUTH_TOKEN",
               "FROM_NUMBER": "TWILIO_FROM_NUMBER"},
    "twilio_backup": {"ACCOUNT_SID": "TWILIO_BACKUP_ACCOUNT_SID", "AUTH_TOKEN": "TWILIO_BACKUP_AUTH_TOKEN",
                      "FROM_NUMBER": "TWILIO_BACKUP_FROM_NUMBER"},
    "sendgrid": {"API_KEY": "SENDGRID_API_KEY", "FROM_EMAIL": "EMAIL_FROM"},
    "smtp": {"HOST": "SMTP_HOST", "PORT": "SMTP_PORT", "FROM_EMAIL": "EMAIL_FROM"},
    "fcm": {"CREDENTIALS": "FCM_CREDENTIALS", "PROJECT_ID": "FCM_PROJECT_ID"},
}
#: The variable that lists each channel's providers; set but empty, the channel has none.
LIST_VARIABLES = {"sms": "SMS_PROVIDERS", "email": "EMAIL_PROVIDERS", "push": "PUSH_PROVIDERS"}
#: The variable whose presence makes a provider real in emulator mode (its account or host).
_SWITCH = {"twilio": "TWILIO_ACCOUNT_SID", "twilio_backup": "TWILIO_BACKUP_ACCOUNT_SID",
           "sendgrid": "SENDGRID_API_KEY", "smtp": "SMTP_HOST", "fcm": "FCM_CREDENTIALS"}


def provider_mode(environ: Mapping[str, str], local: bool) -> str:
    """``PROVIDER_MODE`` from ``environ``, else ``"emulator"`` when ``local`` else ``"real"``.

    Raises:
        ValueError: ``PROVIDER_MODE`` is set to anything but ``emulator`` or ``real``.
    """
    mode = (environ.get("PROVIDER_MODE") or "").strip().lower() or ("emulator" if local else "real")
    if mode not in MODES:
        raise ValueError(f"PROVIDER_MODE={environ.get('PROVIDER_MODE')!r}: expected emulator or real")
    return mode


def build_providers(environ: Mapping[str, str], mode: str, *, emulator_url: str, emulator_smtp_port: int,
                    public_base_url: str, timeout: float) -> dict[str, list[dict]]:
    """``{"sms": [entry, …], "email": […], "push": […]}``, primary first (module docstring).

    In ``real`` mode an unset credential is ``""`` (never a built-in value), which the providers'
    system check reports by variable name. The lists come from ``SMS_PROVIDERS``,
    ``EMAIL_PROVIDERS``, ``PUSH_PROVIDERS`` (comma-separated names) when set, an empty value meaning
    no provider for that channel (``PUSH_PROVIDERS=``: a deployment without push); unset, the
    defaults of :func:`default_order`.

    Raises:
        ValueError: a list names a provider that does not exist.
    """
    def get(name: str) -> str:
        return (environ.get(name) or "").strip()

    def real(provider: str) -> bool:
        return mode == "real" or bool(get(_SWITCH[provider]))

    def value(provider: str, option: str, built_in: str) -> str:
        own = get(ENV[provider][option])
        return own if own or real(provider) else built_in

    def entry(provider: str, backend: str, options: dict) -> dict:
        return {"NAME": provider, "BACKEND": backend, "OPTIONS": options,
                "MODE": "real" if real(provider) else "emulator", "ENV": dict(ENV[provider])}

    callback = get("TWILIO_STATUS_CALLBACK_URL") or (
        None if real("twilio") else f"{public_base_url}/webhooks/twilio/status")

    def twilio(provider: str, sid: str, number: str) -> dict:
        return entry(provider, TWILIO, {
            "ACCOUNT_SID": value(provider, "ACCOUNT_SID", sid),
            "AUTH_TOKEN": value(provider, "AUTH_TOKEN", emu_defaults.TWILIO_AUTH_TOKEN),
            "FROM_NUMBER": value(provider, "FROM_NUMBER", number),
            "BASE_URL": None if real(provider) else emulator_url,
            # Status callbacks (SMS receipts), ?nid= appended (docs/OPERATIONS.md, TWILIO_STATUS_CALLBACK_URL).
            "STATUS_CALLBACK_URL": callback,
            "TIMEOUT": timeout,
        })

    smtp_real = real("smtp")
    by_name = {
        "twilio": twilio("twilio", emu_defaults.TWILIO_ACCOUNT_SID, emu_defaults.TWILIO_FROM_NUMBER),
        # The SMS backup: a second account (own sender), distinct on the emulator too (faults per account).
        "twilio_backup": twilio("twilio_backup", emu_defaults.TWILIO_BACKUP_ACCOUNT_SID,
                                emu_defaults.TWILIO_BACKUP_FROM_NUMBER),
        "sendgrid": entry("sendgrid", SENDGRID, {
            "API_KEY": value("sendgrid", "API_KEY", emu_defaults.SENDGRID_API_KEY),
            "FROM_EMAIL": value("sendgrid", "FROM_EMAIL", emu_defaults.EMAIL_FROM),
            "HOST": None if real("sendgrid") else emulator_url,
            "TIMEOUT": timeout,
        }),
        "smtp": entry("smtp", SMTP, {
            # The emulator's SMTP sink listens where its HTTP API does (a worker on another host
            # reaches it at EMULATOR_URL's address, not at its own loopback).
            "HOST": value("smtp", "HOST", urlsplit(emulator_url).hostname or "127.0.0.1"),
            "PORT": int(get("SMTP_PORT")) if get("SMTP_PORT") else (None if smtp_real else emulator_smtp_port),
            "USE_TLS": get("SMTP_USE_TLS").lower() in ("1", "true", "yes", "on"),
            "USERNAME": get("SMTP_USERNAME"),
            "PASSWORD": get("SMTP_PASSWORD"),
            "FROM_EMAIL": value("smtp", "FROM_EMAIL", emu_defaults.EMAIL_FROM),
            "TIMEOUT": timeout,
        }),
        "fcm": entry("fcm", FCM, {
            "PROJECT_ID": value("fcm", "PROJECT_ID", emu_defaults.FCM_PROJECT_ID),
            "CREDENTIALS": get("FCM_CREDENTIALS") or None,
            "FCM_URL": None if real("fcm") else emulator_url + "/v1/projects/{0}/messages:send",
            "TOKEN_URI": None if real("fcm") else emulator_url + "/token",
            "TIMEOUT": timeout,
        }),
    }
    order = default_order(environ, mode)
    for channel, variable in LIST_VARIABLES.items():
        if variable not in environ:
            continue
        # Set, even empty, it is the list; empty: no provider (providers.registry.unavailable_channel_problem).
        names = [n.strip() for n in get(variable).split(",") if n.strip()]
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ValueError(f"{variable}: unknown provider(s) {', '.join(unknown)} "
                             f"(known: {', '.join(by_name)})")
        order[channel] = names
    return {channel: [by_name[n] for n in names] for channel, names in order.items()}


def default_order(environ: Mapping[str, str], mode: str) -> dict[str, list[str]]:
    """The provider lists when ``*_PROVIDERS`` are not set.

    Emulator mode: ``twilio, twilio_backup`` (only ``twilio`` once real Twilio is configured, unless
    the backup's SID is set too) / ``sendgrid, smtp`` / ``fcm``. Real mode: each channel's primary
    (``twilio``; ``sendgrid`` unless only ``SMTP_HOST`` is set; ``fcm``), so that a deployment that
    forgot a primary's credentials fails ``manage.py check`` naming them rather than silently
    refusing the channel, plus the failover targets whose account or host variable is set
    (``twilio_backup`` with ``TWILIO_BACKUP_ACCOUNT_SID``, ``smtp`` with ``SMTP_HOST``), so that a
    provider nobody configured is never a silent failover target. A deployment without a channel
    says so: ``PUSH_PROVIDERS=`` (empty).
    """
    def has(name: str) -> bool:
        return bool((environ.get(name) or "").strip())

    backup = has("TWILIO_BACKUP_ACCOUNT_SID") or (mode == "emulator" and not has("TWILIO_ACCOUNT_SID"))
    if mode == "emulator":
        email = ["sendgrid", "smtp"]
    else:
        email = (["sendgrid"] if has("SENDGRID_API_KEY") or not has("SMTP_HOST") else []) + \
                (["smtp"] if has("SMTP_HOST") else [])
    return {"sms": ["twilio", *(["twilio_backup"] if backup else [])], "email": email, "push": ["fcm"]}
