from django.apps import AppConfig
from django.core import checks


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def import_models(self) -> None:
        """Register the models that live beside ``notifications.models`` (types and events, the
        inbox, allowed senders, abuse limits): Django imports only ``<app>.models``, and these modules
        import it (never the reverse), so ``notifications.models`` re-exports nothing and has no cycle."""
        super().import_models()
        from notifications import senders as _senders  # noqa: F401
        from notifications.acceptance import models as _acceptance  # noqa: F401
        from notifications.events import models as _events  # noqa: F401
        from notifications.inbox import models as _inbox  # noqa: F401
        from notifications.provider_minutes import models as _provider_minutes  # noqa: F401
        from notifications.send_time import models as _send_time  # noqa: F401
        from notifications.webhooks import models as _webhooks  # noqa: F401

    def ready(self) -> None:
        checks.register(check_quiet_hours_bypass, checks.Tags.compatibility)
        checks.register(check_metrics_token, checks.Tags.security, deploy=True)
        checks.register(check_webhooks_insecure, checks.Tags.security, deploy=True)
        checks.register(check_pipeline, checks.Tags.compatibility)
        # Provider webhooks hand their provider-neutral receipt events to the pipeline.
        from notifications.receipts import accept_receipts
        from providers import receipts as provider_receipts

        provider_receipts.subscribe(accept_receipts)
        # A recipient's erasure (DELETE /v1/users/{id}) covers its notifications too.
        from preferences.api.erasure import register_eraser

        register_eraser(erase_notifications, covers=ERASED_HERE)
        # GET /v1/users/{id}/preferences shows each notification type's effective matrix.
        from notifications.events.matrix import effective_matrix
        from preferences.api.effective import register_matrix

        register_matrix(effective_matrix)


def check_quiet_hours_bypass(app_configs=None, **kwargs):
    """System check: ``QUIET_HOURS_BYPASS_CATEGORIES`` never lets marketing skip quiet hours."""
    from notifications.quiet_hours_policy import check_bypass_setting

    return [checks.Error(problem, hint="See docs/OPERATIONS.md, section Configuration.", id="notifications.E001")
            for problem in check_bypass_setting()]


#: The shortest METRICS_TOKEN the deploy check accepts: 32 characters (e.g. ``secrets.token_urlsafe(32)``
#: gives 43), so it cannot be guessed in any number of scrapes.
MIN_METRICS_TOKEN_LENGTH = 32


def check_metrics_token(app_configs=None, **kwargs):
    """Deploy check (``manage.py check --deploy``): outside local development ``/metrics`` needs
    ``METRICS_TOKEN`` (``notifications.W001``; without it every scrape is refused,
    notifications/metrics.py), at least MIN_METRICS_TOKEN_LENGTH characters long
    (``notifications.W002``)."""
    from django.conf import settings

    token = getattr(settings, "METRICS_TOKEN", "")
    if getattr(settings, "LOCAL_DEVELOPMENT", False):
        return []
    if token and len(token) < MIN_METRICS_TOKEN_LENGTH:
        return [checks.Warning(f"METRICS_TOKEN is {len(token)} character{'s' if len(token) != 1 else ''} long; "
                               f"use at least {MIN_METRICS_TOKEN_LENGTH}: a short bearer token can be guessed",
                               hint="Set METRICS_TOKEN to a long random value, e.g. "
                                    "`python -c 'import secrets; print(secrets.token_urlsafe(32))'` "
                                    "(docs/OPERATIONS.md).", id="notifications.W002")]
    if token:
        return []
    return [checks.Warning("METRICS_TOKEN is not set: outside local development /metrics refuses every request",
                           hint="Set METRICS_TOKEN to a long random value and give it to Prometheus "
                                "(docs/OPERATIONS.md).", id="notifications.W001")]


def check_webhooks_insecure(app_configs=None, **kwargs):
    """Deploy check: outside local development status webhooks never go to http:// or a private
    address (``notifications.W003``; docs/WEBHOOKS.md, "Safety")."""
    from django.conf import settings

    if getattr(settings, "LOCAL_DEVELOPMENT", False) or not settings.WEBHOOKS["ALLOW_INSECURE"]:
        return []
    return [checks.Warning("WEBHOOKS_ALLOW_INSECURE is on outside local development: API clients' webhook URLs "
                           "may reach loopback and private addresses (SSRF)",
                           hint="Unset WEBHOOKS_ALLOW_INSECURE (docs/WEBHOOKS.md, Safety).", id="notifications.W003")]


def check_pipeline(app_configs=None, **kwargs):
    """System check: batch sizes, send concurrency and the lease are in range (a batch of 0 would
    stall delivery silently); ``notifications.E002``."""
    return [checks.Error(problem, hint="See docs/OPERATIONS.md, section Configuration.", id="notifications.E002")
            for problem in check_pipeline_settings()]


def check_pipeline_settings() -> list[str]:
    """Problems with ``NOTIFY["BATCH_SIZE"|"SEND_CONCURRENCY"|"LEASE_SECONDS"|"BATCH_MAX_WAIT_SECONDS"]``,
    ``NOTIFY["RECORD_EVERY_ROWS"|"RECORD_EVERY_SECONDS"]`` and the retention settings
    (:func:`core.partitions.setting_problems`), each naming the setting and the rule (empty when all
    is well)."""
    from django.conf import settings

    problems: list[str] = []
    notify = settings.NOTIFY
    for channel, size in notify.get("BATCH_SIZE", {}).items():
        top = 1000 if channel == "email" else 10_000
        if not 1 <= int(size) <= top:
            problems.append(f'NOTIFY["BATCH_SIZE"]["{channel}"] (BATCH_SIZE_{channel.upper()}) must be in 1..{top}'
                            + (" (SendGrid takes at most 1,000 recipients per request)" if channel == "email" else "")
                            + f", got {size}")
    for channel, value in notify.get("SEND_CONCURRENCY", {}).items():
        if int(value) < 1:
            problems.append(f'NOTIFY["SEND_CONCURRENCY"]["{channel}"] (SEND_CONCURRENCY_{channel.upper()}) must be '
                            f">= 1, got {value}")
    timeout = float(settings.PROVIDER_TIMEOUT_SECONDS)
    if float(notify["LEASE_SECONDS"]) < 2 * timeout:
        problems.append(f"LEASE_SECONDS ({notify['LEASE_SECONDS']}) must be at least twice "
                        f"PROVIDER_TIMEOUT_SECONDS ({timeout:g}): a lease must outlast one provider call")
    if float(notify.get("BATCH_MAX_WAIT_SECONDS", 1)) <= 0:
        problems.append("BATCH_MAX_WAIT_SECONDS must be > 0")
    if int(notify.get("RECORD_EVERY_ROWS", 1)) < 1:
        problems.append(f"RECORD_EVERY_ROWS must be >= 1, got {notify.get('RECORD_EVERY_ROWS')}")
    if float(notify.get("RECORD_EVERY_SECONDS", 1)) <= 0:
        problems.append(f"RECORD_EVERY_SECONDS must be > 0, got {notify.get('RECORD_EVERY_SECONDS')}")
    from core.partitions import setting_problems
    from notifications.webhooks import retention

    return problems + setting_problems() + retention.setting_problems()


#: What :func:`erase_notifications` does to each model of this app holding a user's data.
ERASED_HERE = {
    "notifications.Notification": "content cleared (title, body, html, data, metadata, request fingerprint, "
                                  "limit mark), in the live table and the history alike; unclaimed ones cancelled; "
                                  "dead letters withdrawn (not replayable); every address and number scrubbed from "
                                  "reasons; status history kept for counts",
    "notifications.DeliveryAttempt": "every address and number scrubbed from error messages",
    "notifications.DeliveryEvent": "every address and number scrubbed from details (later receipts too)",
    "notifications.InboxItem": "deleted",
    "notifications.InboxCounts": "deleted",
    "notifications.Event": "data and request fingerprint cleared for events to this user alone (an event to many "
                           "keeps the data they share); the user id stays in user_ids",
    "notifications.Digest": "open ones emptied and closed unsent; every key cleared",
    "notifications.DigestItem": "deleted from open digests; a closed digest's items stay with its sent "
                                "notifications, whose content is cleared",
    "notifications.APIAuditEntry": "kept: the record of who did what; holds the user id only",
    "notifications.SendTimeProfile": "deleted; engagements before the erasure never count again",
    "notifications.WebhookDelivery": "metadata.client (what the client sent about the user) removed from the "
                                     "payloads of its notifications' deliveries, sent or pending, the erasure's "
                                     "own cancellations included; ids, statuses and reasons stay",
    "notifications.WebhookAttempt": "kept: status codes, latency and the endpoint's errors; no user data",
}


def erase_notifications(recipient_id: str, contacts: list[str], requested_by: str) -> dict[str, int]:
    """This app's part of a recipient's erasure (registered with ``preferences.api.erasure``):
    ``notifications.services.erase_notification_content``'s counts; and the recipient's inbox items
    and counts deleted (``notifications.inbox.prune.erase_inbox``: copies of notifications' content, so
    counted in ``notifications_erased`` with the notifications they copy); its open digests emptied and
    closed unsent (``notifications.events.digests.erase_digests``); its send-time profile deleted;
    then, last, the client metadata in its webhook deliveries, including the cancellations this
    erasure just wrote (``notifications.webhooks.outbox.forget_client_metadata``)."""
    from notifications.events.digests import erase_digests
    from notifications.inbox.prune import erase_inbox
    from notifications.send_time.models import SendTimeProfile
    from notifications.services import erase_notification_content
    from notifications.webhooks.outbox import forget_client_metadata

    erase_inbox(recipient_id)
    SendTimeProfile.objects.filter(recipient_id=recipient_id).delete()
    erase_digests(recipient_id)
    counts = erase_notification_content(recipient_id, contacts, by=requested_by)
    forget_client_metadata(recipient_id)
    return counts
