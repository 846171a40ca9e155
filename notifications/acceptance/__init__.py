"""Abuse limits at acceptance: how many notifications of a type or category one user, phone number
or email address may be sent in a sliding window, checked before ``POST /v1/events`` and
``POST /v1/notifications`` write anything (docs/POLICIES.md, "Abuse limits")."""
