"""``manage.py compute_send_times``: recompute every recipient's send-time profile now, as the daily
beat job does (docs/SEND_TIME.md); prints how many recipients have history and how many lost it."""

from django.core.management.base import BaseCommand

from notifications.send_time.compute import recompute


class Command(BaseCommand):
    help = "Recompute every recipient's send-time profile from the last SEND_TIME_HISTORY_DAYS of engagements."

    def handle(self, *args, **options):
        run = recompute()
        self.stdout.write(f"profiles {run.profiles} dropped {run.dropped}")
