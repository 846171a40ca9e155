"""Types that override users' choices get their own scope (issue 23, adversary): ``types:override``
for ``required: true`` or ``quiet_hours: bypass`` over the API.

A client that owns such a type keeps being able to replace it as it is: it gets the new scope. Every
other key does not. The scope names are frozen here (a migration must not import code that changes
later).
"""

from django.db import migrations
from django.db.models import Q

OVERRIDE = "types:override"
#: The scopes before it in canonical order (core.api.scopes.Scope).
BEFORE = ("notifications:send", "notifications:send_high", "notifications:receipts", "recipients:write",
          "preferences:write", "devices:write", "segments:write", "templates:write", "campaigns:write",
          "types:write")


def grant_to_owners_of_overriding_types(apps, schema_editor):
    APIClient = apps.get_model("notifications", "APIClient")
    NotificationType = apps.get_model("notifications", "NotificationType")
    db = schema_editor.connection.alias
    owners = (NotificationType.objects.using(db).filter(Q(required=True) | Q(quiet_hours="bypass"),
                                                        client__isnull=False).values("client_id").distinct())
    for client in APIClient.objects.using(db).filter(pk__in=owners):
        scopes = list(client.scopes or [])
        if OVERRIDE in scopes:
            continue
        at = max((scopes.index(s) + 1 for s in BEFORE if s in scopes), default=0)
        client.scopes = [*scopes[:at], OVERRIDE, *scopes[at:]]
        client.save(update_fields=["scopes"])


def drop(apps, schema_editor):
    APIClient = apps.get_model("notifications", "APIClient")
    for client in APIClient.objects.using(schema_editor.connection.alias).all():
        if OVERRIDE in (client.scopes or []):
            client.scopes = [s for s in client.scopes if s != OVERRIDE]
            client.save(update_fields=["scopes"])


class Migration(migrations.Migration):

    dependencies = [
        ("notifications", "0029_routing_label"),
    ]

    operations = [
        migrations.RunPython(grant_to_owners_of_overriding_types, drop),
    ]
