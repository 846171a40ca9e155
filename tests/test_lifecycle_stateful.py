"""Concurrent writers of a notification's state (issue 24, item 2): a Hypothesis state machine drives
random interleavings of the real entry points that change a notification's status (the pipeline's
claim and record stages, the whole in-app send path, the scheduler's due release and lease expiry,
Twilio callbacks through the signed webhook, SendGrid events through its mapping, the app's receipts,
client, campaign and event cancels, fallback settlement and dead-letter replay) over seven
notifications: an SMS and a push sent alone, an email campaign of two rows, an in-app campaign of one
and an event's fallback pair (email, then SMS). Some steps race two writers, each in its own thread
and database connection, released together by a barrier.

After every step, for every row (docs/ARCHITECTURE.md §5):

* **no backward move**: the status moved only along the documented transitions (:data:`EDGES`, with
  their guard on the reason the row had: a waiting re-send settled by a receipt, a dead letter
  replayed, a fallback channel made not needed and reopened, a provider's later word), and along the
  code's own table (``notifications/lifecycle/table.py``);
* **one end**: once delivered (or up the app's ladder), failed, suppressed, expired or cancelled, a
  row shows no other end except through those documented moves;
* **every change has its timeline entry**: the step that moved a row to a status added a timeline
  line saying that status (the claim's ``sending`` excepted: its attempt row is that line);
* **campaign counts equal the rows**, for both campaigns, and so do the pace sampler's tallies kept
  from what each statement changed (campaigns/tally.py);
* **no worker crashed** (no ``worker_error``); **a stale worker moves nothing**: a worker whose row
  was claimed again since its own claim records nothing over the later one; and **no accepted call
  is lost**: a worker recording an accepted call leaves the row sent or beyond (or waiting with its
  sent marker, which its next claim records as sent).

The machine is tests/lifecycle_machine.py, the documented table tests/lifecycle_oracle.py.
CI runs 15 derandomized examples of 25 steps (≈20 s idle); paths deeper than that budget finds, which a
longer run found or which follow a finding, run as fixed examples at the end (:func:`run_steps`).
Committed rows (``transaction=True``): the racing threads use their own connections.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from core import clock
from notifications.models import Reason
from tests.lifecycle_machine import CLOCK, ROWS, Lifecycle
from tests.lifecycle_oracle import S
from tests.test_webhooks import PUBLIC

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(170)]


@pytest.fixture
def world(settings, monkeypatch):
    """The platform clock under the machine's control, retry and attempt budgets small enough for a
    few dozen steps to reach dead letters and lease take-overs, webhooks signed for :data:`PUBLIC`."""
    settings.PUBLIC_BASE_URL = PUBLIC
    settings.NOTIFY = {**settings.NOTIFY, "LEASE_SECONDS": 30, "MAX_ATTEMPTS": {"high": 2, "standard": 2},
                       "MIN_RETRY_WINDOW_SECONDS": {"high": 0, "standard": 0},
                       "BACKOFF_CAP_SECONDS": {"high": 5.0, "standard": 20.0},
                       "OUTCOME_UNKNOWN_WAIT_SECONDS": {"high": 0, "standard": 40}}
    monkeypatch.setattr(clock, "now", lambda: CLOCK[0])


#: No shrinking: racing steps make a replay flaky, and the generated steps (printed) read well enough.
SETTINGS = settings(max_examples=15, stateful_step_count=25, deadline=None, derandomize=True,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def test_concurrent_writers_keep_every_lifecycle_legal(world):
    run_state_machine_as_test(Lifecycle, settings=SETTINGS)



def run_steps(*steps) -> dict[str, tuple[str, str]]:
    """The machine driven through ``steps`` (``(rule name, args…)``), the invariants after each;
    returns each row's ``(status, reason)`` at the end."""
    state = Lifecycle()
    state.make_rows()
    try:
        for name, *args in steps:
            getattr(state, name)(*args)
            state.every_row_moved_legally_with_its_timeline_entry()
            state.campaign_counts_equal_the_rows()
            state.no_writer_crashed()
        return {name: (state.seen[name].status, state.seen[name].reason) for name in ROWS}
    finally:
        state.teardown()


def test_a_stale_worker_from_before_a_replay_cannot_record_on_the_replayed_row(world):
    """A path of the machine's rules too deep for CI's budget to find at random, run as a fixed
    example: a replay reset ``attempts``, the number every record was fenced by, so a worker stalled
    since the row's first life recorded its late 503 on the replayed row's new claim (back to
    ``scheduled`` while the new worker's call was in flight). Fails on main; fenced by the claim
    number (migration 0032_claim_fence)."""
    ends = run_steps(("claim_and_call", "sms", "unavailable"), ("leases_run_out",), ("due_rows_released",),
                     ("claim_and_call", "sms", "timeout_lost"), ("leases_run_out",), ("dead_letter_replayed", "sms"),
                     ("claim_and_call", "sms", "accepted"), ("record", 0), ("record", 1))

    assert ends["sms"] == (S.SENT, "")


def test_a_claimed_row_of_a_campaign_cancelled_meanwhile_is_cancelled_at_send_time(world):
    """The campaign is cancelled while a worker holds its in-app row (a cancel skips claimed rows);
    that worker dies, and the row's next claim finds the campaign cancelled (checks stage)."""
    ends = run_steps(("in_app_worker_dies",), ("campaign_cancelled", "in_app"), ("leases_run_out",),
                     ("send_in_app",))

    assert ends["in_app"] == (S.CANCELLED, Reason.CAMPAIGN_CANCELLED)


def test_a_row_whose_accepted_call_was_not_recorded_yet_cannot_be_cancelled(world):
    """Found by a longer run of the machine than CI's (150 examples of 50 steps): a worker's call is
    accepted and the worker stalls; the reconciler takes the row back (``scheduled``, reason
    ``lease_expired``: it may have been sent), the client cancels it, then the worker records its
    accepted call. The message went out, so the row must not say ``cancelled``: a row waiting after
    an unknown outcome is not cancellable, like a ``sending`` one (the cancel is refused)."""
    ends = run_steps(("claim_and_call", "sms", "accepted"), ("leases_run_out",), ("client_cancels", "sms"),
                     ("record", 0))

    assert ends["sms"] == (S.SENT, "")

