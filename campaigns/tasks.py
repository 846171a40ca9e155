"""Campaign tasks: thin wrappers over :mod:`campaigns.fanout`."""

from campaigns import fanout
from notifications.tasks import notification_task


@notification_task("campaigns.start_due")
def start_due() -> list[str]:
    """Beat: start fan-out of due campaigns."""
    return fanout.start_due_campaigns()


@notification_task("campaigns.fan_out_page")
def fan_out_page(campaign_id: str, shard_number: int) -> str:
    """Fan out the next page of one shard (``fanout`` queue)."""
    return fanout.fan_out_page(campaign_id, shard_number)


@notification_task("campaigns.reconcile")
def reconcile() -> dict:
    """Beat: re-drive stalled shards, complete finished campaigns."""
    return fanout.reconcile_campaigns()
