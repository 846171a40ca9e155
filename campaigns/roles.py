"""Staff roles: the permissions of the ``marketing``, ``product`` and ``support`` groups
(docs/OPERATIONS.md, "Staff roles", which also says why each role has what it has).

These lists are the current definition; the newest staff-groups data migration (:data:`MIGRATION`)
holds a frozen copy (migrations must not import code that changes later): to change a role, edit
the lists *and* add a migration that applies it, and point :data:`MIGRATION` at it;
tests/test_roles.py fails while the two disagree. Permissions are ``"app_label.codename"``; four
are declared on no model and created by the migration: ``campaigns.send_high_priority``,
``notifications.replay_deadletter``, ``notifications.define_high_priority_type``,
``notifications.replay_webhookdelivery`` (no group has the first
and third: granted to a person).
"""

from __future__ import annotations

MARKETING = "marketing"
PRODUCT = "product"
SUPPORT = "support"

#: The data migration that last set the groups' permissions (its ``sync`` puts them back after a flush).
MIGRATION = "campaigns.migrations.0013_webhook_roles"

CUSTOM_PERMISSIONS = [
    # (app_label, model, codename, name)
    ("campaigns", "campaign", "send_high_priority", "Can send campaigns with high priority"),
    ("notifications", "deadletter", "replay_deadletter", "Can replay dead letters"),
    ("notifications", "notificationtype", "define_high_priority_type",
     "Can define and change high-priority notification types"),
    ("notifications", "webhookdelivery", "replay_webhookdelivery", "Can replay webhook deliveries"),
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
        # A client's status webhooks: endpoints, deliveries and attempts (read-only), and replay one.
        "notifications.view_webhookendpoint",
        "notifications.view_webhookdelivery",
        "notifications.view_webhookattempt",
        "notifications.replay_webhookdelivery",
    ],
}
