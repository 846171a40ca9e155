"""The Celery app: Redis broker, one queue per priority tier and channel (core/queues.py,
docs/ARCHITECTURE.md "Queues and workers").

Queues: ``high.sms``, ``high.email``, ``high.push`` (consumed only by the high-tier worker),
``standard.sms``, ``standard.email``, ``standard.push``, ``fanout``, ``maintenance`` and ``receipts``
(provider delivery receipts, applied by their own worker so callbacks never hold the API's threads).

Every queue is published through the anonymous (default) exchange, routing key = queue name. With
kombu's Redis transport that path needs no ``_kombu.binding.*`` keys, so a ``FLUSHALL`` (or a Redis
restart without persistence) cannot turn later publishes into silently dropped messages.
"""

import os
import warnings

from celery import Celery, bootsteps
from celery.exceptions import SecurityWarning
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    beat_init,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
)
from kombu import Exchange, Queue

from core.queues import ALL_QUEUES, MAINTENANCE_QUEUE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

if os.environ.get("NOTIFY_ROOT_NOTED") == "1":
    # `make run` started as root (a local container or sandbox) says so once, in one line; without
    # this each of the four workers prints Celery's eight-line superuser warning. Anything started
    # otherwise (a deployment) still gets Celery's warning. Only JSON is accepted (no pickle), the
    # case Celery itself lets run as root.
    warnings.filterwarnings("ignore", message="You're running the worker with superuser privileges",
                            category=SecurityWarning)

app = Celery("notify")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django fixup closes every database connection before and after each task unless this is
# set (celery/fixups/django.py, DjangoWorkerFixup.close_database): a new Postgres connection (a
# backend forked, authenticated) for every OTP and every batch, ~12 ms of CPU per OTP across the
# high worker and Postgres in the 1M SMS run. With it the fixup closes them every 2 × N tasks, and
# :func:`_reuse_or_close_connections` applies Django's own rule (CONN_MAX_AGE, CONN_HEALTH_CHECKS)
# before each task, as Django does before each request.
app.conf["CELERY_DB_REUSE_MAX"] = 1000


_default_exchange = Exchange("", type="direct")
app.conf.task_queues = [Queue(name, _default_exchange, routing_key=name) for name in ALL_QUEUES]
app.conf.task_default_queue = MAINTENANCE_QUEUE
app.conf.task_default_exchange = ""
app.conf.task_default_routing_key = MAINTENANCE_QUEUE
app.conf.task_create_missing_queues = False

app.autodiscover_tasks(["notifications", "campaigns"])


class WorkerHeartbeat(bootsteps.StartStopStep):
    """Every ``WORKER_HEARTBEAT_SECONDS`` (10) the worker writes the heartbeat of the kinds of worker
    whose queues it consumes (``notifications.health.write_worker_heartbeat``; /metrics'
    ``notify_worker_heartbeat_age_seconds``, the ``WorkerHeartbeatMissing`` alert). From the worker's
    own timer, which its main loop runs: a worker whose loop is stuck stops beating too."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.tref = None

    def start(self, worker):
        from notifications.health import WORKER_HEARTBEAT_SECONDS, write_worker_heartbeat

        def beat():
            write_worker_heartbeat(list(worker.app.amqp.queues.consume_from))

        beat()
        self.tref = worker.timer.call_repeatedly(WORKER_HEARTBEAT_SECONDS, beat)

    def stop(self, worker):
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None


app.steps["worker"].add(WorkerHeartbeat)


@after_setup_logger.connect
@after_setup_task_logger.connect
def _redact_worker_logs(logger=None, **_kwargs):
    """Celery's own handlers (the task logger's, any it adds to the root) redact every record as
    Django's do: contacts masked, sensitive content removed (config/redaction.py)."""
    import logging

    from core.redaction import add_filter, install_record_factory

    install_record_factory()
    for each in (logger, logging.getLogger()):
        if each is not None:
            add_filter(each.handlers)


#: The beat entries also queued once when beat starts (config/settings.py's CELERY_BEAT_SCHEDULE).
RUN_AT_BEAT_START = ("maintain-partitions",)


@beat_init.connect
def _run_at_beat_start(sender=None, **_kwargs):
    """Queue each entry of :data:`RUN_AT_BEAT_START` once as beat starts, with its schedule's options.
    django_celery_beat dates a never-run entry's last run at its creation, so the hourly partition
    maintenance would first run an hour after a fresh start (every row in DEFAULT meanwhile), and a
    restart would again wait out the interval; a run at start is harmless (one at a time, idempotent)."""
    beat_app = sender.app if sender is not None else app
    for name in RUN_AT_BEAT_START:
        entry = beat_app.conf.beat_schedule[name]
        beat_app.send_task(entry["task"], **entry.get("options", {}))


@worker_process_init.connect
def _reset_after_fork(**_kwargs):
    """Provider SDK clients and DB connections must not be shared across a fork.

    Also moves everything imported so far out of the garbage collector's sight (``gc.freeze``) and
    makes young-generation collections rarer: a 500-row batch allocates hundreds of thousands of
    short-lived objects, and py-spy showed full collections over the long-lived Django/SDK objects
    as a visible share of a standard worker's time.
    """
    import gc

    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        conn.close()
    from providers.registry import reset_backends

    reset_backends()


@worker_process_shutdown.connect
@worker_shutdown.connect
def _close_provider_sessions(**_kwargs):
    """A worker stops: close the provider backends this process opened (their aiohttp sessions), so
    none is collected unclosed at exit (aiohttp's ``ERROR Unclosed client session``). A prefork pool
    process hears ``worker_process_shutdown``; a threaded or solo worker, ``worker_shutdown`` once its
    pool has stopped."""
    from providers.registry import close_all_backends

    close_all_backends()


@task_prerun.connect
def _reuse_or_close_connections(task=None, **_kwargs):
    """Before each task a worker runs, close this thread's database connections that are broken (an
    error and no longer usable: Postgres restarted) or older than ``CONN_MAX_AGE``; keep the others.
    Not for a task run eagerly inside its caller (``apply()``, tests): the connection and the open
    transaction are the caller's (Celery's fixup skips those too)."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()
