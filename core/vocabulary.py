"""The words every floor uses for what a notification is: its channel, its tier, its category and the
recipient's locale. One definition each; models' ``TextChoices`` and the queue names are built on
these."""

from __future__ import annotations

import re

#: Delivery channels, in the order every listing (metrics, queues, settings) uses.
CHANNELS = ("sms", "email", "push", "in_app")
#: The channels a provider delivers (``settings.PROVIDERS``); ``in_app`` is written to the user's
#: inbox in Postgres (notifications/inbox), no provider involved.
PROVIDER_CHANNELS = ("sms", "email", "push")
#: Priority tiers: ``high`` (one at a time, quiet hours bypassed, failover) and ``standard`` (batched).
TIERS = ("high", "standard")
#: A notification's category (opt-outs per category, quiet-hours policy): 1–64 of ``a-z 0-9 _ . -``,
#: starting with a letter or digit.
CATEGORY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
#: A recipient's locale as the API accepts it: a BCP 47-like tag, ``-`` or ``_`` between subtags
#: (``de-DE``, ``pt_BR``).
LOCALE_PATTERN = re.compile(r"^[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*$")
#: A template variant's locale (the campaigns API and the admin's template form): the same tags with
#: ``-`` only between subtags (``de-DE``), as the template rules have always been.
TEMPLATE_LOCALE_PATTERN = re.compile(r"^[A-Za-z]{2,3}(?:-[A-Za-z0-9]{2,8})*$")
#: Characters Postgres text cannot hold: NUL and lone surrogates (a JSON ``"\ud800"`` parses to one).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: A notification type's key (``order_shipped``): 1–64 of ``a-z 0-9 _ -``, starting with a letter or
#: digit (a slug: it appears in URLs, ``/v1/notification-types/{key}``).
TYPE_KEY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
