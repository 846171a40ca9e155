"""Campaign tasks: thin wrappers over :mod:`campaigns.fanout`, runs and the pace sampler."""

from campaigns import fanout, pace, runs
from core.queues import FAN_OUT_PAGE_TASK
from notifications.tasks import notification_task


@notification_task("campaigns.start_due")
def start_due() -> list[str]:
    """Beat: start fan-out of due campaigns."""
    return fanout.start_due_campaigns()


@notification_task(FAN_OUT_PAGE_TASK)
def fan_out_page(campaign_id: str, shard_number: int) -> str:
    """Fan out the next page of one shard (``fanout`` queue). A page that raises is recorded on the
    shard and campaign (last error, failures) and re-raised, so Celery's ``task_failure`` counts it
    (``notify_task_failures_total``); the reconciler re-drives the shard."""
    try:
        return fanout.fan_out_page(campaign_id, shard_number)
    except Exception as exc:
        fanout.record_page_failure(campaign_id, shard_number, exc)
        raise


@notification_task("campaigns.reconcile")
def reconcile() -> dict:
    """Beat: re-drive stalled shards, complete finished campaigns."""
    return fanout.reconcile_campaigns()


@notification_task("campaigns.create_due_runs")
def create_due_runs() -> dict:
    """Beat (maintenance queue): make the runs of recurring campaigns' due occurrences."""
    return runs.create_due_runs()


@notification_task("campaigns.sample_pace")
def sample_pace() -> int:
    """Beat (``maintenance``, every ``CAMPAIGN_PACE_SAMPLE_SECONDS``): the counts of every campaign
    fanning out or sending into its minute's row (docs/CAMPAIGNS.md, "Pace")."""
    return pace.sample_due()
