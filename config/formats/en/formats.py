"""Date formats of the admin (English): instants to the second with their zone, ISO order, so
support agents can compare them with logs and with what a user reports. Input formats are Django's.
The notification pages show milliseconds and the viewer's own zone (notifications/admin/time.py)."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
