"""``manage.py load_demo_data [--force]``: a small demo to click through in the admin and call with
the API: three users with email, phone and push devices, a notification type ``demo_order_shipped``
(push, email, in_app), a segment ``demo`` of the three, and a draft push campaign to it.

Idempotent: each row is made only when missing (by its natural key: user id, push token, type key,
segment id, campaign name), through the services the API and the admin use; a second run changes
nothing. Refused outside local development (``NOTIFY_ENV=local``, ``.run/env``) unless ``--force``:
demo users in a production database would receive real messages.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from campaigns import services
from campaigns.models import Campaign, CampaignStatus, Segment
from notifications.api.types import NotificationTypeSerializer
from notifications.events.models import NotificationType
from notifications.events.services import save_type
from preferences.models import Device, Recipient
from preferences.services import register_device, upsert_recipient

USERS = [
    # (user id, contact fields, [(platform, push token)])
    ("demo-ada", {"email": "ada@example.com", "phone": "+4915100000001", "locale": "en", "timezone": "Europe/Berlin",
                  "attributes": {"first_name": "Ada"}}, [("android", "demo-token-ada-android")]),
    ("demo-ben", {"email": "ben@example.com", "phone": "+4915100000002", "locale": "de", "timezone": "Europe/Vienna",
                  "attributes": {"first_name": "Ben"}}, [("ios", "demo-token-ben-ios"), ("web", "demo-token-ben-web")]),
    ("demo-chloe", {"email": "chloe@example.com", "locale": "fr", "timezone": "Europe/Paris",
                    "attributes": {"first_name": "Chloé"}}, []),
]
TYPE_KEY = "demo_order_shipped"
TYPE = {
    "name": "Order shipped (demo)", "category": "orders", "channels": ["push", "email", "in_app"],
    "required_data": ["order_id"],
    "templates": [
        {"channel": "push", "locale": "en", "title": "Order {{ data.order_id }} shipped",
         "body": "Hi {{ first_name }}, it is on its way."},
        {"channel": "email", "locale": "en", "title": "Your order {{ data.order_id }} has shipped",
         "body": "Hi {{ first_name }},\nyour order {{ data.order_id }} is on its way."},
        {"channel": "in_app", "locale": "en", "title": "Order {{ data.order_id }} shipped",
         "body": "It is on its way."},
    ],
}
SEGMENT_ID = "demo"
CAMPAIGN_NAME = "Demo: spring sale"


class Command(BaseCommand):
    help = "Fill a local database with demo users, a notification type, a segment and a draft campaign."

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="Run even outside local development (NOTIFY_ENV).")

    def handle(self, *args, force, **options):
        if not settings.LOCAL_DEVELOPMENT and not force:
            raise CommandError(f"NOTIFY_ENV={settings.NOTIFY_ENV}: demo data goes into local development databases "
                               "only (NOTIFY_ENV=local); --force to load it anyway")
        with transaction.atomic():
            made = self._load()
        self.stdout.write("Demo data: " + (", ".join(made) if made else "already there, nothing changed") + ".")

    def _load(self) -> list[str]:
        made = []
        for user_id, contacts, devices in USERS:
            if not Recipient.objects.filter(pk=user_id).exists():
                upsert_recipient(user_id, **contacts)
                made.append(f"user {user_id}")
            recipient = Recipient.objects.get(pk=user_id)
            for platform, token in devices:
                if not Device.objects.filter(push_token=token).exists():
                    register_device(recipient, platform=platform, push_token=token)
                    made.append(f"device {token}")
        if not NotificationType.objects.filter(pk=TYPE_KEY).exists():
            serializer = NotificationTypeSerializer(data=TYPE)
            if not serializer.is_valid():  # the API's rules: a demo that breaks them is a bug here
                raise CommandError(f"demo type {TYPE_KEY}: {serializer.errors}")
            fields = dict(serializer.validated_data)
            save_type(TYPE_KEY, fields, fields.pop("templates"), client=None)
            made.append(f"type {TYPE_KEY}")
        segment = Segment.objects.filter(pk=SEGMENT_ID).first()
        if segment is None:
            segment, _ = services.upsert_segment(SEGMENT_ID, name="Demo users")
            made.append(f"segment {SEGMENT_ID}")
        added = services.change_members(segment, add=[user_id for user_id, _, _ in USERS], remove=[])["added"]
        if added:
            made.append(f"{added} segment members")
        if not Campaign.objects.filter(name=CAMPAIGN_NAME).exists():
            services.create_campaign(client=None, idempotency_key=None, status=CampaignStatus.DRAFT, name=CAMPAIGN_NAME,
                                     segment=segment, channel="push", category="marketing",
                                     title="Spring sale", body="Hi {{ first_name }}, 20% off today only.")
            made.append(f"campaign {CAMPAIGN_NAME!r}")
        return made
