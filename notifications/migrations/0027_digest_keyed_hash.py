"""A sensitive type's digest key is a keyed hash (issue 23 #7): HMAC-SHA256 with a key derived from
SECRET_KEY, no longer a plain SHA-256 (a 6-digit code was recovered from that in a second).

The keyed hash is taken over the plain one (notifications/events/digests.py, ``keyed_hash``), so
every stored plain key of a sensitive type (``dk-`` + 40 hex digits) is rewritten here: an open
digest keeps collecting its events across the deploy (the new code renders the same key), and no
crackable hash stays in the database. Frozen here: the salt and the shape of the hash.
"""

import re

from django.db import migrations
from django.utils.crypto import salted_hmac

SALT = "notifications.digests.key"
PLAIN = re.compile(r"dk-[0-9a-f]{40}")


def to_keyed(apps, schema_editor):
    Digest = apps.get_model("notifications", "Digest")
    db = schema_editor.connection.alias
    for digest in Digest.objects.using(db).filter(type__sensitive=True, key__startswith="dk-").only("pk", "key"):
        if PLAIN.fullmatch(digest.key):
            digest.key = "dk-" + salted_hmac(SALT, digest.key[3:], algorithm="sha256").hexdigest()[:40]
            digest.save(update_fields=["key"])


class Migration(migrations.Migration):

    dependencies = [
        ("notifications", "0026_admin_log_client_prefix"),
    ]

    operations = [
        migrations.RunPython(to_keyed, migrations.RunPython.noop),
    ]
