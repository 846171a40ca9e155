"""API key scopes (issue 11 #2): ``APIClient.scopes`` replaces ``allow_high``.

Existing clients keep exactly what they could do before: every scope, with
``notifications:send_high`` only where ``allow_high`` was set. Operators narrow them in the admin
(API clients page) to what each service needs; new clients get the least-privilege default
(``notifications:send``, ``read``). The lists are frozen here (a migration must not import code that
changes later).
"""

from django.db import migrations, models

import core.api.scopes

EVERY_SCOPE_BUT_HIGH = ["notifications:send", "recipients:write", "preferences:write", "devices:write",
                        "segments:write", "templates:write", "campaigns:write", "read"]


def scopes_from_allow_high(apps, schema_editor):
    APIClient = apps.get_model("notifications", "APIClient")
    for client in APIClient.objects.using(schema_editor.connection.alias).all():
        scopes = list(EVERY_SCOPE_BUT_HIGH)
        if client.allow_high:
            scopes.insert(1, "notifications:send_high")
        client.scopes = scopes
        client.save(update_fields=["scopes"])


def allow_high_from_scopes(apps, schema_editor):
    APIClient = apps.get_model("notifications", "APIClient")
    for client in APIClient.objects.using(schema_editor.connection.alias).all():
        client.allow_high = "notifications:send_high" in (client.scopes or [])
        client.save(update_fields=["allow_high"])


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0012_updated_at_platform_clock'),
    ]

    operations = [
        migrations.AddField(
            model_name='apiclient',
            name='scopes',
            field=models.JSONField(blank=True, default=core.api.scopes.default_scopes,
                                   help_text="What this key may do; see the README's scopes table.",
                                   validators=[core.api.scopes.validate_scopes]),
        ),
        migrations.RunPython(scopes_from_allow_high, allow_high_from_scopes),
        migrations.RemoveField(
            model_name='apiclient',
            name='allow_high',
        ),
    ]
