"""Staff roles: the permissions of the ``marketing``, ``product`` and ``support`` groups
(docs/OPERATIONS.md, "Staff roles").

These lists are the current definition. The newest staff-groups data migration
(:data:`MIGRATION`; first ``campaigns/0002_staff_groups``) holds a frozen copy (migrations must not
import code that changes later): to change a role, edit the lists here *and* add a migration that
applies the change, and point :data:`MIGRATION` at it; ``tests/test_roles.py`` fails while the two
disagree.

Permissions are ``"app_label.codename"``. Two are not declared on any model (their ``Meta`` has
no ``permissions``); the migration creates their rows:

* ``campaigns.send_high_priority`` (content type campaigns.campaign): may give a campaign priority
  ``high`` (see :func:`campaigns.forms.can_send_high`), launch, cancel, edit or delete a
  high-priority campaign, and change a template or a segment's members that an active one uses
  (:func:`campaigns.admin_views.high_priority_lock`). No group has it; grant it to a person.
* ``notifications.replay_deadletter`` (content type notifications.deadletter, the proxy): may use
  the dead-letter admin's "Replay" action.
* ``notifications.define_high_priority_type`` (content type notifications.notificationtype): may give
  a notification type priority ``high``, and change or delete a high one (the admin's side of the
  API's ``notifications:send_high`` rule for types, :mod:`notifications.admin.types`). No group has
  it; grant it to a person.

Who defines notification types: ``product``, not ``marketing``. Types carry the transactional
messages (password resets, one-time codes, security alerts, order updates): categories users cannot
opt out of (``required``), quiet hours bypassed, sensitive content. A marketer who edits them could
put a link into a message users cannot refuse; campaign templates stay marketing's. ``product``
sees recipients (a preview renders a recipient's attributes) and no notifications or events; support
reads events and types (to explain what a user got), read-only, and a user's in-app inbox (items
with their seen/read/archived state, and the badge counts), read-only.

Who manages the sender allow-list (:mod:`notifications.senders`: the From / Reply-To addresses,
domains and SMS numbers types may name): superusers only. ``product`` reads it (it defines types
and must know which senders exist) but cannot widen it: whoever writes a type's sender must not
also approve it; marketing and support do not see it.
"""

from __future__ import annotations

MARKETING = "marketing"
PRODUCT = "product"
SUPPORT = "support"

#: The data migration that last set the groups' permissions (its ``sync`` puts them back after a flush).
MIGRATION = "campaigns.migrations.0011_sender_allowlist_roles"

CUSTOM_PERMISSIONS = [
    # (app_label, model, codename, name)
    ("campaigns", "campaign", "send_high_priority", "Can send campaigns with high priority"),
    ("notifications", "deadletter", "replay_deadletter", "Can replay dead letters"),
    ("notifications", "notificationtype", "define_high_priority_type",
     "Can define and change high-priority notification types"),
]


def _manage(app_label: str, *models: str) -> list[str]:
    return [f"{app_label}.{action}_{model}" for model in models for action in ("add", "change", "delete", "view")]


GROUP_PERMISSIONS: dict[str, list[str]] = {
    # Segments, members, templates and campaigns; recipients read-only (segment member lookups,
    # template previews). No notification admin at all: campaign pages show counts, never content.
    MARKETING: [
        *_manage("campaigns", "segment", "segmentmember", "template", "templatevariant", "campaign"),
        "preferences.view_recipient",
        "preferences.view_unsubscribe",  # what a campaign cost (its unsubscribes)
        "notifications.view_frequencycap",  # what bounds a campaign per user
    ],
    # Notification types and their templates (matrix, preview for a recipient); recipients read-only
    # (the preview's user). No notifications, events or campaigns.
    PRODUCT: [
        *_manage("notifications", "notificationtype", "typetemplate", "frequencycap"),
        "preferences.view_recipient",
        "notifications.view_acceptancelimit",
        "notifications.view_allowedsender",  # the senders its types may name; superusers change the list
    ],
    # Look up people and what happened to their notifications; edit preferences on a user's behalf;
    # replay dead letters; read the API audit log (who changed a user through the API); read events
    # (per user and channel, with reasons) and the types they came from. Contacts, devices,
    # notifications, events and types stay read-only; no campaign pages.
    SUPPORT: [
        "preferences.view_recipient",
        "preferences.view_device",
        "preferences.view_preferences",
        "preferences.add_preferences",
        "preferences.change_preferences",
        "notifications.view_notification",
        "notifications.view_deliveryattempt",
        "notifications.view_deliveryevent",
        "notifications.view_deadletter",
        "notifications.replay_deadletter",
        "notifications.view_apiauditentry",
        "notifications.view_event",
        "notifications.view_notificationtype",
        "notifications.view_typetemplate",
        "preferences.view_unsubscribe",
        "notifications.view_frequencycap",
        "notifications.view_acceptancelimit",
        "notifications.view_inboxitem",  # a user's in-app inbox and its counts (read-only)
    ],
}
