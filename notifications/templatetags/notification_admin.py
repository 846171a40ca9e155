"""Admin index banner: the dead-letter depth at a glance."""

from django import template
from django.urls import reverse
from django.utils.html import format_html

register = template.Library()


@register.simple_tag(takes_context=True)
def dead_letter_banner(context):
    request = context.get("request")
    if request is None or not request.user.has_perm("notifications.view_notification"):
        return ""
    from notifications.admin import dead_letter_depth

    depth = dead_letter_depth()
    color = "#cf222e" if depth else "#1a7f37"
    return format_html(
        '<p style="padding:8px 12px;border-left:4px solid {};background:#f6f8fa">'
        'Dead letters: <a href="{}"><b>{}</b></a></p>', color,
        reverse("admin:notifications_deadletter_changelist"), depth)
