"""Settings: 12-factor, environment first.

Order of precedence for every value: the process environment, then ``.run/env`` (written by
``scripts/devservices.py`` with the URLs of the project-local Postgres and Redis), then the default
below. Production must set ``SECRET_KEY``, ``DATABASE_URL``, ``REDIS_URL``, ``ALLOWED_HOSTS`` and the
provider credentials; with no provider credentials the platform talks to the local provider
emulator (``providers/emulator``), which is what ``make run`` and the tests use.
"""

import os
from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from config.provider_settings import build_providers, provider_mode

BASE_DIR = Path(__file__).resolve().parent.parent
RUN_DIR = BASE_DIR / ".run"

env = environ.Env()
if (RUN_DIR / "env").exists():
    # read_env never overrides a variable already set in the process environment.
    environ.Env.read_env(str(RUN_DIR / "env"))

# "local" (a checkout's .run/env) or "production" (the default); what it changes: docs/OPERATIONS.md.
NOTIFY_ENV = env("NOTIFY_ENV", default="production").strip().lower()
if NOTIFY_ENV not in ("local", "production"):
    raise ImproperlyConfigured(f"NOTIFY_ENV={NOTIFY_ENV!r}: expected local or production")
LOCAL_DEVELOPMENT = NOTIFY_ENV == "local"

DEBUG = env.bool("DEBUG", default=False)
# No default: production must set it; `make run`/`make test` get a random one in `.run/env`.
SECRET_KEY = env("SECRET_KEY")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

# --- HTTPS and cookies: on outside local development; behind a TLS proxy see TRUST_X_FORWARDED_PROTO.
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=not LOCAL_DEVELOPMENT)
SECURE_REDIRECT_EXEMPT = [r"^(healthz|readyz|metrics)$"]
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0 if LOCAL_DEVELOPMENT else 365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=not LOCAL_DEVELOPMENT)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=not LOCAL_DEVELOPMENT)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not LOCAL_DEVELOPMENT)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=not LOCAL_DEVELOPMENT)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework_api_key",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "axes",
    "preferences",
    "notifications",
    "campaigns",
    "providers",
    # A tool, not part of the platform: listed for its management commands only (bench/apps.py).
    "bench",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A broken database connection (Postgres restarting) answers 503 with Retry-After, not 500.
    "core.api.errors.DatabaseUnavailableMiddleware",
    # Static files (admin CSS/JS, Swagger UI) served by the app itself from STATIC_ROOT.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Records every API write (who, what, when, outcome) after its answer: the API audit log.
    "notifications.audit.AuditMiddleware",
    # Last, as django-axes requires: answers a locked-out login attempt (see AXES_* below).
    "axes.middleware.AxesMiddleware",
]

# --- Admin login throttling (django-axes; per username and TCP peer: docs/SECURITY.md) -----------
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env.int("ADMIN_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("ADMIN_LOGIN_LOCKOUT_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "config" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "config.wsgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:55432/app")}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"].setdefault("TEST", {})["NAME"] = env("TEST_DATABASE_NAME", default="test_app")

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:56379/0")

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "cache",
        "OPTIONS": {"socket_timeout": 1, "socket_connect_timeout": 1},
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Admin dates as "2030-03-01 09:00:00 UTC" (config/formats/en/formats.py), not "March 1, 2030, 9 a.m.".
FORMAT_MODULE_PATH = ["config.formats"]

STATIC_URL = "static/"
# `manage.py collectstatic` writes here; WhiteNoise serves it (hashed names, pre-compressed copies).
STATIC_ROOT = Path(env("STATIC_ROOT", default=str(BASE_DIR / ".run" / "static")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- REST API ---------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["notifications.api.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["notifications.api.auth.IsApiClient", "notifications.api.auth.HasRequiredScope"],
    "DEFAULT_THROTTLE_CLASSES": ["notifications.api.throttling.ApiClientRateThrottle"],
    "DEFAULT_SCHEMA_CLASS": "notifications.api.schema.ScopedAutoSchema",
    "EXCEPTION_HANDLER": "core.api.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["core.api.parsers.StrictJSONParser"],
    "UNAUTHENTICATED_USER": None,
}
API_KEY_CUSTOM_HEADER = None
# Email HTML may be up to 1,000,000 characters (up to 4 bytes each in UTF-8).
DATA_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024
# Per-client rate limit when the client row has none (DRF rate syntax: "<n>/<second|minute|hour>").
API_DEFAULT_RATE_LIMIT = env("API_DEFAULT_RATE_LIMIT", default="6000/min")
# A verified API key is remembered this long per web process (0: never); a revocation, expiry date or
# scope change made elsewhere is honoured within it (at once in the process that saved it).
API_KEY_CACHE_SECONDS = env.float("API_KEY_CACHE_SECONDS", default=5.0)

SPECTACULAR_SETTINGS = {
    "TITLE": "Notification platform API",
    "DESCRIPTION": (
        "Send one notification to one user by SMS, email, push or to their in-app inbox (`in_app`), now "
        "or later; events of notification types, campaigns to segments; manage recipients, their "
        "preferences and devices; list and mark a user's inbox. Authenticate with `Authorization: Api-Key <key>`."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI assets served from the drf-spectacular-sidecar package: /api/docs/ works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "ChannelEnum": "preferences.models.Channel.choices",
        "PriorityEnum": "notifications.models.Priority.choices",
        "NotificationStatusEnum": "notifications.models.Status.choices",
        "CampaignStatusEnum": "campaigns.models.CampaignStatus.choices",
        "ReasonEnum": "notifications.models.Reason.choices",
        "EffectiveReasonEnum": "preferences.api.serializers.EFFECTIVE_REASONS",
    },
}

# --- Celery -------------------------------------------------------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Long delays live in Postgres, never in ETAs: the visibility timeout only covers short countdowns.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600),
    "socket_timeout": 5,
    "socket_connect_timeout": 5,
}
# Give up publishing fast when Redis is down: the reconciler re-drives it (docs/ARCHITECTURE.md §6).
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2,
                                    "interval_max": 0.5}
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_BEAT_SCHEDULE = {
    "release-due-notifications": {
        "task": "notifications.release_due",
        "schedule": env.float("SCHEDULER_INTERVAL_SECONDS", default=1.0),
        "options": {"queue": "maintenance", "expires": 5},
    },
    "start-due-campaigns": {
        "task": "campaigns.start_due",
        "schedule": env.float("SCHEDULER_INTERVAL_SECONDS", default=1.0),
        "options": {"queue": "maintenance", "expires": 5},
    },
    "create-campaign-runs": {
        "task": "campaigns.create_due_runs",
        "schedule": env.float("SCHEDULER_INTERVAL_SECONDS", default=1.0),
        "options": {"queue": "maintenance", "expires": 5},
    },
    "reconcile-campaigns": {
        "task": "campaigns.reconcile",
        "schedule": env.float("RECONCILER_INTERVAL_SECONDS", default=5.0),
        "options": {"queue": "maintenance", "expires": 10},
    },
    "reconcile-notifications": {
        "task": "notifications.reconcile",
        "schedule": env.float("RECONCILER_INTERVAL_SECONDS", default=5.0),
        "options": {"queue": "maintenance", "expires": 10},
    },
}
DJANGO_CELERY_BEAT_TZ_AWARE = True

# --- Delivery pipeline --------------------------------------------------------------------------
NOTIFY = {
    # Claim lease (seconds), renewed while in flight (notifications/delivery/leases.py); then re-driven.
    "LEASE_SECONDS": env.int("LEASE_SECONDS", default=30),
    "LEASE_HEARTBEAT": env.bool("LEASE_HEARTBEAT", default=True),
    # Verified provider receipts applied in the request (True: in-process tests) or queued (False).
    "RECEIPTS_INLINE": env.bool("RECEIPTS_INLINE", default=False),
    # Seconds the receipts drain waits after a batch that was not full, so that batches grow.
    "RECEIPTS_DRAIN_LINGER": env.float("RECEIPTS_DRAIN_LINGER", default=0.2),
    # A task holding rows longer (seconds) is stuck: its leases are no longer renewed.
    "LEASE_MAX_HOLD_SECONDS": env.int("LEASE_MAX_HOLD_SECONDS", default=900),
    # Seconds an unknown outcome (timeout, lost lease) waits before lookup and resend, per tier.
    "OUTCOME_UNKNOWN_WAIT_SECONDS": {"high": env.float("OUTCOME_UNKNOWN_WAIT_HIGH", default=0),
                                     "standard": env.float("OUTCOME_UNKNOWN_WAIT_STANDARD", default=120)},
    # A `queued` row not consumed after this long (seconds) is enqueued again (message lost).
    "QUEUED_STALE_SECONDS": {"high": env.int("QUEUED_STALE_SECONDS_HIGH", default=10),
                             "standard": env.int("QUEUED_STALE_SECONDS", default=60)},
    # Attempts per notification before it is dead-lettered, by priority tier.
    "MAX_ATTEMPTS": {"high": env.int("MAX_ATTEMPTS_HIGH", default=5),
                     "standard": env.int("MAX_ATTEMPTS_STANDARD", default=8)},
    # ...and not before this many seconds since the first attempt.
    "MIN_RETRY_WINDOW_SECONDS": {"high": env.float("MIN_RETRY_WINDOW_HIGH", default=120),
                                 "standard": env.float("MIN_RETRY_WINDOW_STANDARD", default=3600)},
    # Exponential backoff with full jitter: uniform(0, min(cap, base * 2**(attempt-1))) seconds.
    "BACKOFF_BASE_SECONDS": {"high": env.float("BACKOFF_BASE_HIGH", default=1.0),
                             "standard": env.float("BACKOFF_BASE_STANDARD", default=10.0)},
    "BACKOFF_CAP_SECONDS": {"high": env.float("BACKOFF_CAP_HIGH", default=30.0),
                            "standard": env.float("BACKOFF_CAP_STANDARD", default=1800.0)},
    # Retries due within this many seconds use a Celery countdown; longer ones go back to `scheduled`.
    "MAX_COUNTDOWN_SECONDS": 5,
    # How long the sent marker `sent:{id}` lives in Redis (seconds): 48 h per docs/ARCHITECTURE.md §6.
    "SENT_MARKER_TTL_SECONDS": 48 * 3600,
    # Rows released per scheduler run.
    "RELEASE_BATCH_SIZE": env.int("RELEASE_BATCH_SIZE", default=1000),
    # Test-only: a file holding a clock offset in seconds (notifications/clock.py); unset in production.
    "CLOCK_OFFSET_FILE": env("CLOCK_OFFSET_FILE", default=None),
    # Standard tier: notifications per send task (email: one SendGrid request, ≤ 1,000 recipients).
    "BATCH_SIZE": {"email": env.int("BATCH_SIZE_EMAIL", default=500),
                   "sms": env.int("BATCH_SIZE_SMS", default=200),
                   "push": env.int("BATCH_SIZE_PUSH", default=200),
                   # in_app: one INSERT of the batch's items and one counts upsert (docs/APP.md).
                   "in_app": env.int("BATCH_SIZE_IN_APP", default=500)},
    # Standard tier: SDK calls in flight per worker process (a sliding window; the bulkhead bounds it).
    "SEND_CONCURRENCY": {"email": env.int("SEND_CONCURRENCY_EMAIL", default=4),
                         "sms": env.int("SEND_CONCURRENCY_SMS", default=8),
                         "push": env.int("SEND_CONCURRENCY_PUSH", default=8),
                         "in_app": 1},  # no provider call: the inbox write is one statement
    # Record ended calls this often mid-batch (docs/RELIABILITY.md, "Duplicate window").
    "RECORD_EVERY_ROWS": env.int("RECORD_EVERY_ROWS", default=50),
    "RECORD_EVERY_SECONDS": env.float("RECORD_EVERY_SECONDS", default=0.25),
    # A standard batch waiting longer (seconds) for budget or slots puts the rest back to `scheduled`.
    "BATCH_MAX_WAIT_SECONDS": env.float("BATCH_MAX_WAIT_SECONDS", default=60),
    # Abuse limits at acceptance, and why these numbers: docs/POLICIES.md, "Abuse limits".
    "ACCEPTANCE_LIMITS": [
        {"name": "otp_per_user", "match": {"type": "otp"}, "per": "user", "limit": 5, "window_seconds": 600},
        {"name": "otp_per_phone", "match": {"type": "otp"}, "per": "phone", "limit": 10, "window_seconds": 600},
    ],
    # Frequency caps at send time, and why push only: docs/POLICIES.md.
    "FREQUENCY_CAPS": [
        {"name": "marketing-push", "category": "marketing", "channel": "push", "limit": 3, "window_seconds": 86400},
    ],
    # The in-app inbox's refresh push and prune (docs/APP.md; the INBOX_* rows of docs/OPERATIONS.md).
    "INBOX": {
        "REFRESH_PUSH": env.bool("INBOX_REFRESH_PUSH", default=True),
        "REFRESH_PUSH_SECONDS": env.int("INBOX_REFRESH_PUSH_SECONDS", default=5),
        "RETENTION_DAYS": env.int("INBOX_RETENTION_DAYS", default=90),
        "PRUNE_EVERY_SECONDS": env.int("INBOX_PRUNE_EVERY_SECONDS", default=60),
        "PRUNE_BATCH": env.int("INBOX_PRUNE_BATCH", default=5000),
    },
}
# Days kept per partitioned table (core/partitions.py: whole day partitions dropped past it), and how
# many days ahead of today partitions exist (docs/OPERATIONS.md, "Retention and partitions").
NOTIFY["RETENTION_DAYS"] = {
    "notifications_notificationhistory": env.int("RETENTION_NOTIFICATIONS_DAYS", default=90),
    "notifications_deliveryattempt": env.int("RETENTION_ATTEMPTS_DAYS", default=30),
    "notifications_deliveryevent": env.int("RETENTION_EVENTS_DAYS", default=90),
    "notifications_apiauditentry": env.int("RETENTION_AUDIT_DAYS", default=365),
}
NOTIFY["PARTITIONS_AHEAD_DAYS"] = env.int("PARTITIONS_AHEAD_DAYS", default=7)
CELERY_BEAT_SCHEDULE["maintain-partitions"] = {
    "task": "notifications.maintain_partitions",
    "schedule": env.float("PARTITION_MAINTENANCE_SECONDS", default=3600.0),
    "options": {"queue": "maintenance", "expires": 600},
}
# Where a row lives (docs/ARCHITECTURE.md; notifications/lifecycle/archive.py): finished rows stay live
# HOT_HOURS after their last change, then move to the history; dead letters wait DEAD_LETTER_DAYS for
# a replay; an idempotent retry finds an archived send for as long as the history keeps it.
NOTIFY["HOT_HOURS"] = env.float("HOT_HOURS", default=6)
NOTIFY["DEAD_LETTER_DAYS"] = env.int("DEAD_LETTER_DAYS", default=14)
NOTIFY["ARCHIVE_BATCH_SIZE"] = env.int("ARCHIVE_BATCH_SIZE", default=5000)
NOTIFY["ARCHIVE_MAX_ROWS_PER_RUN"] = env.int("ARCHIVE_MAX_ROWS_PER_RUN", default=100_000)
# The provider health page's last hour (notifications/provider_minutes): beat rolls the delivery log up
# per provider and minute this often, and the rows are kept this many days.
NOTIFY["PROVIDER_HEALTH_SAMPLE_SECONDS"] = env.float("PROVIDER_HEALTH_SAMPLE_SECONDS", default=60.0)
NOTIFY["PROVIDER_HEALTH_KEEP_DAYS"] = env.int("PROVIDER_HEALTH_KEEP_DAYS", default=3)
CELERY_BEAT_SCHEDULE["sample-provider-minutes"] = {
    "task": "notifications.sample_provider_minutes",
    "schedule": NOTIFY["PROVIDER_HEALTH_SAMPLE_SECONDS"],
    "options": {"queue": "maintenance", "expires": NOTIFY["PROVIDER_HEALTH_SAMPLE_SECONDS"]},
}
CELERY_BEAT_SCHEDULE["archive-notifications"] = {
    "task": "notifications.archive",
    "schedule": env.float("ARCHIVE_INTERVAL_SECONDS", default=60.0),
    "options": {"queue": "maintenance", "expires": 60},
}
# The inbox prune (notifications/inbox/prune.py), on the beat schedule above, at the interval set here.
CELERY_BEAT_SCHEDULE["prune-inbox"] = {
    "task": "notifications.prune_inbox",
    "schedule": float(NOTIFY["INBOX"]["PRUNE_EVERY_SECONDS"]),
    "options": {"queue": "maintenance", "expires": max(10, NOTIFY["INBOX"]["PRUNE_EVERY_SECONDS"])},
}

# Status webhooks to the calling services (docs/WEBHOOKS.md; the WEBHOOK_* rows of docs/OPERATIONS.md).
WEBHOOKS = {
    # http:// and loopback/private addresses allowed: local development and tests only, never production.
    "ALLOW_INSECURE": env.bool("WEBHOOKS_ALLOW_INSECURE", default=LOCAL_DEVELOPMENT),
    # Subscriptions are read once per process per this many seconds (a save in the process: at once).
    "CACHE_SECONDS": env.float("WEBHOOKS_CACHE_SECONDS", default=5.0),
    # One request: connect + answer (seconds); one endpoint's batch: this budget, then the rest waits.
    "TIMEOUT_SECONDS": env.float("WEBHOOKS_TIMEOUT_SECONDS", default=5.0),
    "BATCH_BUDGET_SECONDS": env.float("WEBHOOKS_BATCH_BUDGET_SECONDS", default=15.0),
    "BATCH_SIZE": env.int("WEBHOOKS_BATCH_SIZE", default=100),
    "MAX_RESPONSE_BYTES": env.int("WEBHOOKS_MAX_RESPONSE_BYTES", default=64 * 1024),
    # Retries with exponential backoff (base * 2**(attempt-1), capped) for this long, then failed.
    "RETRY_BASE_SECONDS": env.float("WEBHOOKS_RETRY_BASE_SECONDS", default=5.0),
    "RETRY_CAP_SECONDS": env.float("WEBHOOKS_RETRY_CAP_SECONDS", default=3600.0),
    "RETRY_FOR_SECONDS": env.float("WEBHOOKS_RETRY_FOR_SECONDS", default=24 * 3600.0),
    # An endpoint failing (no success) this long is disabled, with its reason.
    "DISABLE_AFTER_SECONDS": env.float("WEBHOOKS_DISABLE_AFTER_SECONDS", default=3 * 24 * 3600.0),
    "MAX_ENDPOINTS_PER_CLIENT": env.int("WEBHOOKS_MAX_ENDPOINTS_PER_CLIENT", default=10),
    # Deliveries (with their attempts) are deleted this many days after they were written, by beat,
    # PRUNE_BATCH per statement for at most PRUNE_BUDGET_SECONDS a tick.
    "KEEP_DAYS": env.int("WEBHOOKS_KEEP_DAYS", default=7),
    "PRUNE_BATCH": env.int("WEBHOOKS_PRUNE_BATCH", default=10_000),
    "PRUNE_BUDGET_SECONDS": env.float("WEBHOOKS_PRUNE_BUDGET_SECONDS", default=20.0),
}
CELERY_BEAT_SCHEDULE["prune-webhooks"] = {
    "task": "notifications.prune_webhooks",
    "schedule": env.float("WEBHOOKS_PRUNE_EVERY_SECONDS", default=300.0),
    "options": {"queue": "maintenance", "expires": 300},
}
CELERY_BEAT_SCHEDULE["dispatch-webhooks"] = {
    "task": "notifications.dispatch_webhooks",
    "schedule": env.float("WEBHOOKS_DISPATCH_SECONDS", default=1.0),
    "options": {"queue": "webhooks", "expires": 5},
}

# Send-time optimisation (docs/SEND_TIME.md): each recipient's engagement hours over HISTORY_DAYS,
# a profile only from MIN_EVENTS engaged notifications on; recomputed in bulk every COMPUTE_SECONDS.
SEND_TIME = {
    "HISTORY_DAYS": env.int("SEND_TIME_HISTORY_DAYS", default=90),
    "MIN_EVENTS": env.int("SEND_TIME_MIN_EVENTS", default=3),
}
CELERY_BEAT_SCHEDULE["compute-send-times"] = {
    "task": "notifications.compute_send_times",
    "schedule": env.float("SEND_TIME_COMPUTE_SECONDS", default=86400.0),
    "options": {"queue": "maintenance", "expires": 3600},
}

# Budgets, breakers and bulkheads per provider NAME over "DEFAULT" (docs/ARCHITECTURE.md §8).
_rate_override = env.float("PROVIDER_RATE_PER_S", default=None)
PROVIDER_LIMITS = {
    "DEFAULT": {
        "RATE_PER_S": 1000.0 if _rate_override is None else _rate_override,  # messages/s, both tiers
        "HIGH_RESERVED_FRACTION": env.float("PROVIDER_HIGH_RESERVED_FRACTION", default=0.1),
        "BURST_SECONDS": 1.0,                       # bucket capacity = rate × this
        "MAX_CONCURRENCY": {"high": env.int("BULKHEAD_HIGH", default=6),
                            "standard": env.int("BULKHEAD_STANDARD", default=32)},
        "BREAKER": {
            "WINDOW_SECONDS": env.int("BREAKER_WINDOW_SECONDS", default=10),
            "MIN_CALLS": env.int("BREAKER_MIN_CALLS", default=20),
            "FAILURE_RATE": env.float("BREAKER_FAILURE_RATE", default=0.5),
            "OPEN_SECONDS": env.float("BREAKER_OPEN_SECONDS", default=15),
        },
    },
    # SendGrid counts recipients, not requests, against our budget; SMTP is a slow backup.
    "sendgrid": {"RATE_PER_S": 10000.0 if _rate_override is None else _rate_override},
    # FCM's default quota, 600,000/min per project (docs/PROVIDERS.md §3).
    "fcm": {"RATE_PER_S": 10000.0 if _rate_override is None else _rate_override},
    "smtp": {"RATE_PER_S": 100.0 if _rate_override is None else _rate_override},
}

# Categories sent during quiet hours and allowed at `priority: high` (never marketing: system check).
QUIET_HOURS_BYPASS_CATEGORIES = tuple(env.list("QUIET_HOURS_BYPASS_CATEGORIES", default=["security", "transactional"]))
# Categories offered as rows of the admin's per-category opt-out checkboxes.
PREFERENCE_CATEGORIES = env.list("PREFERENCE_CATEGORIES", default=["marketing"])

# --- Campaigns ----------------------------------------------------------------------------------
CAMPAIGNS = {
    # Members per fan-out page (one task each) and the most shards one campaign is split into.
    "PAGE_SIZE": env.int("CAMPAIGN_PAGE_SIZE", default=1000),
    "SHARDS": env.int("CAMPAIGN_SHARDS", default=4),
    # A shard whose page chain made no progress for this long (seconds) is re-driven.
    "SHARD_STALE_SECONDS": env.int("CAMPAIGN_SHARD_STALE_SECONDS", default=30),
    # Local-time campaigns: the zone used for recipients whose zone is missing or invalid.
    "DEFAULT_TIMEZONE": env("CAMPAIGN_DEFAULT_TIMEZONE", default="UTC"),
    # Local-time campaigns: later than this (seconds) after their instant, a member is "missed".
    "MISSED_GRACE_SECONDS": env.int("CAMPAIGN_MISSED_GRACE_SECONDS", default=600),
    # manage.py doctor fails for a campaign that made no progress for this many minutes.
    "STALL_MINUTES": env.int("CAMPAIGN_STALL_MINUTES", default=10),
    # A rule segment's count preview (docs/SEGMENTS.md): past this many ms, the planner's estimate.
    "PREVIEW_TIMEOUT_MS": env.int("SEGMENT_PREVIEW_TIMEOUT_MS", default=2000),
    # Recurring campaigns (docs/RECURRING.md): the least time between two occurrences (seconds), the
    # largest COUNT, and how far a rule is expanded when it is checked (occurrences, days).
    "SCHEDULE_MIN_INTERVAL_SECONDS": env.int("CAMPAIGN_SCHEDULE_MIN_INTERVAL_SECONDS", default=3600),
    "SCHEDULE_MAX_COUNT": env.int("CAMPAIGN_SCHEDULE_MAX_COUNT", default=1000),
    "SCHEDULE_CHECK_OCCURRENCES": env.int("CAMPAIGN_SCHEDULE_CHECK_OCCURRENCES", default=1000),
    "SCHEDULE_CHECK_DAYS": env.int("CAMPAIGN_SCHEDULE_CHECK_DAYS", default=731),
    # Bounds on one template render (docs/CAMPAIGNS.md, "Render bounds"); past one: template_error.
    "RENDER_CPU_MS": env.int("TEMPLATE_RENDER_CPU_MS", default=100),
    "RENDER_MAX_ITERATIONS": env.int("TEMPLATE_RENDER_MAX_ITERATIONS", default=10_000),
    "RENDER_MAX_OUTPUT": env.int("TEMPLATE_RENDER_MAX_OUTPUT", default=2_000_000),
    # CPU ms for all the template checks of one save; past it 422 render_budget.
    "CHECK_CPU_MS": env.int("TEMPLATE_CHECK_CPU_MS", default=1000),
    # Saves checking templates at once per process, and the wait for a slot (then 503).
    "CHECK_CONCURRENCY": env.int("TEMPLATE_CHECK_CONCURRENCY", default=1),
    "CHECK_WAIT_MS": env.int("TEMPLATE_CHECK_WAIT_MS", default=1000),
    # How often beat counts each campaign fanning out or sending for its page (docs/CAMPAIGNS.md, "Pace").
    "PACE_SAMPLE_SECONDS": env.float("CAMPAIGN_PACE_SAMPLE_SECONDS", default=15.0),
}
CELERY_BEAT_SCHEDULE["sample-campaign-pace"] = {
    "task": "campaigns.sample_pace",
    "schedule": CAMPAIGNS["PACE_SAMPLE_SECONDS"],
    "options": {"queue": "maintenance", "expires": CAMPAIGNS["PACE_SAMPLE_SECONDS"]},
}

# --- Providers ----------------------------------------------------------------------------------
EMULATOR_URL = env("EMULATOR_URL", default=f"http://127.0.0.1:{env.int('EMULATOR_PORT', default=8900)}")
EMULATOR_SMTP_PORT = env.int("EMULATOR_SMTP_PORT", default=8925)
PROVIDER_TIMEOUT_SECONDS = env.float("PROVIDER_TIMEOUT_SECONDS", default=10.0)
# High tier (OTPs): slower than this counts as failing (breaker, failover).
PROVIDER_TIMEOUT_SECONDS_HIGH = env.float("PROVIDER_TIMEOUT_SECONDS_HIGH",
                                          default=min(3.0, PROVIDER_TIMEOUT_SECONDS))
# The URL at which providers reach this platform's webhooks (behind a proxy: the public one).
PUBLIC_BASE_URL = env("PUBLIC_BASE_URL", default=f"http://127.0.0.1:{env('PORT', default='8000')}")
# SendGrid Event Webhook verification key (base64 DER); unset, every SendGrid event is 403.
SENDGRID_WEBHOOK_PUBLIC_KEY = env("SENDGRID_WEBHOOK_PUBLIC_KEY", default="")
# Behind a TLS-terminating proxy: trust its X-Forwarded-Proto (only when this is set).
if env.bool("TRUST_X_FORWARDED_PROTO", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Provider mode, "emulator" or "real", and the providers per channel (config/provider_settings.py).
try:
    PROVIDER_MODE = provider_mode(os.environ, LOCAL_DEVELOPMENT)
    # Ordered provider list per channel: the first is the primary (docs/ARCHITECTURE.md §8 provider router).
    PROVIDERS = build_providers(os.environ, PROVIDER_MODE, emulator_url=EMULATOR_URL,
                                emulator_smtp_port=EMULATOR_SMTP_PORT, public_base_url=PUBLIC_BASE_URL,
                                timeout=PROVIDER_TIMEOUT_SECONDS)
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from None

# --- Operations (docs/OPERATIONS.md) -----------------------------------------------------------
# /metrics needs `Authorization: Bearer <METRICS_TOKEN>`; unset, it answers loopback requests only.
METRICS_TOKEN = env("METRICS_TOKEN", default="")
# prometheus-client multiprocess mode: each process writes its counters here, /metrics sums them.
PROMETHEUS_MULTIPROC_DIR = env("PROMETHEUS_MULTIPROC_DIR", default=str(RUN_DIR / "prometheus"))
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", PROMETHEUS_MULTIPROC_DIR)
Path(PROMETHEUS_MULTIPROC_DIR).mkdir(parents=True, exist_ok=True)

# --- Logging ------------------------------------------------------------------------------------
# Every record is redacted when made and by every handler (core/redaction.py, docs/ARCHITECTURE.md §10).
LOGGING_CONFIG = "core.redaction.configure_logging"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"redact": {"()": "core.redaction.RedactingFilter"},
                "client_errors_at_info": {"()": "core.log_levels.ClientErrorsAtInfo"},
                "suspicious_at_warning": {"()": "core.log_levels.SuspiciousRequestsAtWarning"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact"]}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    "loggers": {
        # Django's own handlers (mail_admins, the DEBUG-only console) replaced by the root's.
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        # A 4xx is the client's problem: INFO, not WARNING (5xx stay ERROR; core/log_levels.py).
        "django.request": {"filters": ["client_errors_at_info"]},
        # A refused admin lookup (a probe: 400): one WARNING line, not ERROR with a traceback.
        **{f"django.security.{name}": {"filters": ["suspicious_at_warning"]}
           for name in ("DisallowedModelAdminLookup", "DisallowedModelAdminToField")},
        "django.db.backends": {"level": "WARNING"},
        # Not its version banner at every process start; its login failures and lockouts stay.
        "axes.apps": {"level": "WARNING"},
        "celery": {"level": "WARNING"},
        "twilio.http_client": {"level": "WARNING"},
        # python-http-client (SendGrid) logs whole request bodies, i.e. email content, at DEBUG.
        "python_http_client": {"level": "WARNING"},
    },
}
