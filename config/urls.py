"""URL map: the REST API under /v1, the admin, the OpenAPI schema and its interactive docs."""

from django.contrib import admin
from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from notifications.api import views as notification_views
from preferences.api import views as preference_views

admin.site.site_header = "Notification platform"
admin.site.site_title = "Notification platform admin"
admin.site.index_title = "Delivery, recipients and campaigns"

urlpatterns = [
    path("v1/notifications", notification_views.NotificationListView.as_view(), name="notifications"),
    path("v1/notifications/<uuid:notification_id>", notification_views.NotificationDetailView.as_view(),
         name="notification-detail"),
    path("v1/notifications/<uuid:notification_id>/cancel", notification_views.NotificationCancelView.as_view(),
         name="notification-cancel"),
    path("v1/users/<str:user_id>", preference_views.RecipientView.as_view(), name="user"),
    path("v1/users/<str:user_id>/preferences", preference_views.PreferencesView.as_view(), name="user-preferences"),
    path("v1/users/<str:user_id>/devices", preference_views.DevicesView.as_view(), name="user-devices"),
    path("v1/users/<str:user_id>/devices/<path:push_token>", preference_views.DeviceView.as_view(),
         name="user-device"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("admin/", admin.site.urls),
]
