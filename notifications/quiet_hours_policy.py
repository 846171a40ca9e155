"""Which notifications may skip a recipient's quiet hours, and which priority/category pairs are allowed.

Quiet hours follow the **category**: ``settings.QUIET_HOURS_BYPASS_CATEGORIES`` are sent during
quiet hours at any priority; ``priority: high`` is accepted only with one of them or with no
category (an uncategorised urgent message, such as the quick start's OTP, which bypasses them);
everything else waits for the window's end (docs/API.md). The accept-time check
(:func:`priority_category_problem`: 422, or a form error in the admin) and the send-time rule
(:func:`bypasses_quiet_hours`) read the same setting.
"""

from __future__ import annotations

from django.conf import settings

MARKETING = "marketing"


def bypass_categories() -> frozenset[str]:
    """The categories sent during quiet hours (``settings.QUIET_HOURS_BYPASS_CATEGORIES``)."""
    return frozenset(getattr(settings, "QUIET_HOURS_BYPASS_CATEGORIES", ("security", "transactional")))


def bypasses_quiet_hours(priority: str, category: str) -> bool:
    """True when a notification of this ``priority`` (``high``/``standard``) and ``category`` ('' = none)
    is sent during the recipient's quiet hours instead of waiting for the window's end."""
    if category:
        return category in bypass_categories()
    return priority == "high"


def priority_category_problem(priority: str, category: str) -> tuple[str, str] | None:
    """Accept-time rule: ``(code, message)`` when ``priority`` and ``category`` may not go together,
    else ``None``. Codes: ``marketing_not_high``, ``category_not_high``."""
    if priority != "high" or not category:
        return None
    allowed = ", ".join(sorted(bypass_categories())) or "(none configured)"
    if category == MARKETING:
        return ("marketing_not_high",
                f"marketing is never high priority (high may skip quiet hours); use priority standard, "
                f"or a category that may bypass quiet hours: {allowed}")
    if category not in bypass_categories():
        return ("category_not_high",
                f"category '{category}' may not be sent at priority high: high is for categories that may "
                f"bypass quiet hours ({allowed}, setting QUIET_HOURS_BYPASS_CATEGORIES) or for no category")
    return None


def campaign_category_problem(priority: str, category: str) -> tuple[str, str] | None:
    """Accept-time rule for campaigns (bulk sends): ``(code, message)`` when a **standard**
    campaign names a category that bypasses quiet hours (``security``, ``transactional``: they also
    carry no unsubscribe link and are what users cannot turn off), else ``None``. A bulk message
    relabelled ``security`` would otherwise skip quiet hours and the link every bulk email must
    carry; a real emergency to everyone is a high-priority campaign, which needs its own permission
    (``campaigns.send_high_priority``, scope ``notifications:send_high``). Code:
    ``bulk_transactional_category``."""
    if priority == "high" or category not in bypass_categories():
        return None
    return ("bulk_transactional_category",
            f"a standard campaign is bulk mail and may not use category '{category}', which bypasses quiet hours "
            f"and carries no unsubscribe link ({', '.join(sorted(bypass_categories()))}); use marketing or another "
            "category, or priority high for an emergency to everyone (needs the high-priority permission)")


def check_bypass_setting() -> list[str]:
    """Problems with ``QUIET_HOURS_BYPASS_CATEGORIES`` (for ``manage.py check``)."""
    if MARKETING in bypass_categories():
        return ["QUIET_HOURS_BYPASS_CATEGORIES: marketing may never bypass quiet hours"]
    return []
