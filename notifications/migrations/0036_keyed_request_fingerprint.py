"""The idempotency fingerprint is a keyed hash: HMAC-SHA256 with a key derived from SECRET_KEY,
no longer a plain SHA-256 of the request body (a 6-digit code in a sensitive send was recovered from
that by trying the million codes in 2 s).

The keyed hash is taken over the plain one (notifications/services.py, ``keyed_fingerprint``), so
every stored plain fingerprint (64 hex digits) of a notification or an event is rewritten here: a
replay of a request accepted before the deploy is still recognised, and no crackable hash stays in
the database. Campaigns: campaigns/migrations/0012. Frozen here: the salt and the shape.
"""

from django.db import migrations, models
from django.utils.crypto import salted_hmac

SALT = "notifications.request_fingerprint"
PLAIN = r"^[0-9a-f]{64}$"


def keyed(plain: str) -> str:
    return "rf-" + salted_hmac(SALT, plain, algorithm="sha256").hexdigest()[:61]


def rewrite(model, db: str, batch: int = 2000) -> None:
    rows = model.objects.using(db).filter(request_fingerprint__regex=PLAIN).only("pk", "request_fingerprint")
    while True:
        page = list(rows[:batch])
        if not page:
            return
        for row in page:
            row.request_fingerprint = keyed(row.request_fingerprint)
        model.objects.using(db).bulk_update(page, ["request_fingerprint"])


def to_keyed(apps, schema_editor):
    db = schema_editor.connection.alias
    for name in ("Notification", "Event"):
        rewrite(apps.get_model("notifications", name), db)


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0035_notification_limit_contact'),
    ]

    operations = [
        migrations.AlterField(
            model_name='notification',
            name='request_fingerprint',
            field=models.CharField(blank=True, default='',
                                   help_text='Keyed hash (HMAC) of the canonical request body.',
                                   max_length=64),
        ),
        migrations.RunPython(to_keyed, migrations.RunPython.noop),
    ]
