"""URL map: the REST API under /v1, the admin, the OpenAPI schema and its interactive docs."""

from django.contrib import admin
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import path, register_converter
from django.urls.converters import PathConverter
from django.views import defaults
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from campaigns.api import segment_rules as segment_rule_views
from campaigns.api import views as campaign_views
from notifications import health, health_admin, metrics_scrape, unsubscribe_views
from notifications.api import app_receipts as app_receipt_views
from notifications.api import events as event_views
from notifications.api import inbox as inbox_views
from notifications.api import types as type_views
from notifications.api import views as notification_views
from notifications.api import webhooks as webhook_views
from preferences import admin_guard
from preferences.api import views as preference_views
from providers.sendgrid import webhooks as sendgrid_webhooks
from providers.twilio import webhooks as twilio_webhooks

admin.site.site_header = "Notification platform"
admin.site.site_title = "Notification platform admin"
admin.site.index_title = "Delivery, recipients and campaigns"
health_admin.install(admin.site)  # /admin/provider-health/, linked from the index
admin_guard.install(admin.site)  # a NUL byte anywhere in an admin request: 400, not a 500 from Postgres


def favicon(request):
    """Browsers ask every site for /favicon.ico: the Swagger UI icon (collected static file)."""
    return HttpResponsePermanentRedirect(static("drf_spectacular_sidecar/swagger-ui-dist/favicon-32x32.png"))


class AnyTextConverter(PathConverter):
    """Like ``path`` (slashes included), but line breaks too: a push token path with a control
    character reaches its view, whose token rule names it (422), instead of missing the URL (404)."""

    regex = "(?s:.+)"


register_converter(AnyTextConverter, "text")

urlpatterns = [
    path("favicon.ico", favicon),
    path("v1/notifications", notification_views.NotificationListView.as_view(), name="notifications"),
    path("v1/notifications/<uuid:notification_id>", notification_views.NotificationDetailView.as_view(),
         name="notification-detail"),
    path("v1/notifications/<uuid:notification_id>/cancel", notification_views.NotificationCancelView.as_view(),
         name="notification-cancel"),
    path("v1/notifications/<uuid:notification_id>/receipts", app_receipt_views.NotificationReceiptView.as_view(),
         name="notification-receipts"),
    path("v1/events", event_views.EventListView.as_view(), name="events"),
    path("v1/events/<uuid:event_id>", event_views.EventDetailView.as_view(), name="event-detail"),
    path("v1/events/<uuid:event_id>/recipients", event_views.EventRecipientsView.as_view(), name="event-recipients"),
    path("v1/events/<uuid:event_id>/cancel", event_views.EventCancelView.as_view(), name="event-cancel"),
    path("v1/notification-types", type_views.TypeListView.as_view(), name="notification-types"),
    path("v1/notification-types/<str:key>", type_views.TypeView.as_view(), name="notification-type"),
    path("v1/users/<str:user_id>", preference_views.RecipientView.as_view(), name="user"),
    path("v1/users/<str:user_id>/notifications", notification_views.UserNotificationsView.as_view(),
         name="user-notifications"),
    path("v1/users/<str:user_id>/inbox", inbox_views.InboxView.as_view(), name="user-inbox"),
    path("v1/users/<str:user_id>/inbox/counts", inbox_views.InboxCountsView.as_view(), name="user-inbox-counts"),
    path("v1/users/<str:user_id>/inbox/mark", inbox_views.InboxMarkView.as_view(), name="user-inbox-mark"),
    path("v1/users/<str:user_id>/preferences", preference_views.PreferencesView.as_view(), name="user-preferences"),
    path("v1/users/<str:user_id>/devices", preference_views.DevicesView.as_view(), name="user-devices"),
    path("v1/users/<str:user_id>/devices/<text:push_token>", preference_views.DeviceView.as_view(),
         name="user-device"),
    path("v1/segments", campaign_views.SegmentListView.as_view(), name="segments"),
    path("v1/segment-preview", segment_rule_views.SegmentPreviewView.as_view(), name="segment-preview"),
    path("v1/templates", campaign_views.TemplateListView.as_view(), name="templates"),
    path("v1/segments/<str:segment_id>", campaign_views.SegmentView.as_view(), name="segment"),
    path("v1/segments/<str:segment_id>/members", campaign_views.SegmentMembersView.as_view(), name="segment-members"),
    path("v1/templates/<str:template_id>", campaign_views.TemplateView.as_view(), name="template"),
    path("v1/campaigns", campaign_views.CampaignListView.as_view(), name="campaigns"),
    path("v1/campaigns/<uuid:campaign_id>", campaign_views.CampaignDetailView.as_view(), name="campaign-detail"),
    path("v1/campaigns/<uuid:campaign_id>/cancel", campaign_views.CampaignCancelView.as_view(),
         name="campaign-cancel"),
    path("v1/campaigns/<uuid:campaign_id>/pause", campaign_views.CampaignPauseView.as_view(), name="campaign-pause"),
    path("v1/campaigns/<uuid:campaign_id>/resume", campaign_views.CampaignResumeView.as_view(),
         name="campaign-resume"),
    path("v1/campaigns/<uuid:campaign_id>/runs", campaign_views.CampaignRunsView.as_view(), name="campaign-runs"),
    path("v1/webhook-endpoints", webhook_views.WebhookEndpointListView.as_view(), name="webhook-endpoints"),
    path("v1/webhook-endpoints/<uuid:endpoint_id>", webhook_views.WebhookEndpointView.as_view(),
         name="webhook-endpoint"),
    path("v1/webhook-endpoints/<uuid:endpoint_id>/test", webhook_views.WebhookEndpointTestView.as_view(),
         name="webhook-endpoint-test"),
    path("webhooks/twilio/status", twilio_webhooks.status_callback, name="webhook-twilio-status"),
    path("webhooks/sendgrid/events", sendgrid_webhooks.events, name="webhook-sendgrid-events"),
    path("u/<str:token>", unsubscribe_views.unsubscribe_view, name="unsubscribe"),  # email links (RFC 8058)
    path("metrics", metrics_scrape.metrics_view, name="metrics"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("admin/", admin.site.urls),
    path("", RedirectView.as_view(url="/api/docs/", permanent=False)),
]


def _json_or_html(status_code: int, code: str, message: str, html_view):
    """API and webhook paths get the API's JSON error shape; the admin keeps Django's pages."""
    from core.api.errors import json_error_view

    json_view = json_error_view(status_code, code, message)

    def view(request, exception=None, **kwargs):
        if request.path.startswith(("/v1/", "/webhooks/", "/api/")):
            if isinstance(exception, RequestDataTooBig):  # outside DRF's views (webhooks)
                from core.api.errors import json_error_view, too_large_message

                return json_error_view(413, "payload_too_large", too_large_message())(request, exception)
            return json_view(request, exception)
        return html_view(request, exception, **kwargs) if exception is not None else html_view(request, **kwargs)

    return view


handler400 = _json_or_html(400, "bad_request", "the request could not be read (too large or malformed)",
                           defaults.bad_request)
handler404 = _json_or_html(404, "not_found", "no such resource; see /api/docs/", defaults.page_not_found)
handler500 = _json_or_html(500, "server_error", "unexpected error; it has been logged",
                           lambda request, exception=None: defaults.server_error(request))
