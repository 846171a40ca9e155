"""App receipts get their own scope (issue 23 #12): ``notifications:receipts``, no longer part of
``notifications:send``.

A key that has posted an app receipt successfully (its audit log holds a ``POST …/receipts`` under
400) keeps doing so: it gets the new scope. Every other key, send-only ones included, does not (a
send-only key could move an admin campaign's counts). The scope names are frozen here (a migration
must not import code that changes later).
"""

from django.db import migrations

RECEIPTS = "notifications:receipts"
#: The scopes before it in canonical order (core.api.scopes.Scope).
BEFORE = ("notifications:send", "notifications:send_high")


def grant_to_receipt_reporters(apps, schema_editor):
    APIClient = apps.get_model("notifications", "APIClient")
    APIAuditEntry = apps.get_model("notifications", "APIAuditEntry")
    db = schema_editor.connection.alias
    reporters = (APIAuditEntry.objects.using(db).filter(method="POST", path__endswith="/receipts", status__lt=400)
                 .values("client_id").distinct())
    for client in APIClient.objects.using(db).filter(pk__in=reporters):
        scopes = list(client.scopes or [])
        if RECEIPTS in scopes:
            continue
        at = max((scopes.index(s) + 1 for s in BEFORE if s in scopes), default=0)
        client.scopes = [*scopes[:at], RECEIPTS, *scopes[at:]]
        client.save(update_fields=["scopes"])


def drop(apps, schema_editor):
    APIClient = apps.get_model("notifications", "APIClient")
    for client in APIClient.objects.using(schema_editor.connection.alias).all():
        if RECEIPTS in (client.scopes or []):
            client.scopes = [s for s in client.scopes if s != RECEIPTS]
            client.save(update_fields=["scopes"])


class Migration(migrations.Migration):

    dependencies = [
        ("notifications", "0024_merge_0022_app_receipts_0023_type_in_app_quiet_hours"),
    ]

    operations = [
        migrations.RunPython(grant_to_receipt_reporters, drop),
    ]
