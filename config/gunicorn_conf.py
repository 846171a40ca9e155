"""gunicorn settings of the web process (``Procfile``: ``gunicorn -c config/gunicorn_conf.py``).

Logging: gunicorn's error and access logs get the redaction here (core/redaction.py; contacts and
the ``/u/<token>`` capability masked). Keep-alive :data:`keepalive` (``GUNICORN_KEEPALIVE``, 75 s),
longer than a load balancer's idle timeout. Reads are bounded by :data:`worker_class`
(config/gunicorn_worker.py). Errors gunicorn answers itself (414, 431, 400) are in the API's JSON
error shape: :func:`write_json_error` replaces its HTML pages; the limits stay gunicorn's defaults.
Everything else stays on the command line. Why each: docs/OPERATIONS.md, "The web process
(gunicorn) and its logs".
"""

import json
import os
import sys
from pathlib import Path

from gunicorn import glogging, util

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the config package, before Django

from core.redaction import add_filter, install_record_factory

install_record_factory()

keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", "75"))
worker_class = "config.gunicorn_worker.ReadBoundThreadWorker"


class RedactingLogger(glogging.Logger):
    """gunicorn's logger with a :class:`core.redaction.RedactingFilter` on every handler of its
    error and access logs (set up again on every reopen)."""

    def setup(self, cfg):
        super().setup(cfg)
        add_filter(self.error_log.handlers)
        add_filter(self.access_log.handlers)


logger_class = RedactingLogger

#: The error code of each status gunicorn answers itself (``gunicorn.workers.base.Worker.handle_error``).
GUNICORN_ERROR_CODES = {400: "bad_request", 403: "forbidden", 414: "request_line_too_long",
                        417: "expectation_failed", 431: "header_too_large", 500: "server_error",
                        501: "not_implemented"}
#: The part of the request each status names (``field``); None: the request as a whole.
GUNICORN_ERROR_FIELDS = {414: "request_line", 431: "headers"}


def write_json_error(sock, status_int, reason, mesg):
    """gunicorn's ``util.write_error`` with the API's error shape as the body, built by the API's
    builder (``core.api.errors.field_error_body``): ``{"error": {"status": 414, "code":
    "request_line_too_long", "message": "request_line: …", "fields": [{"field": "request_line",
    "code": "request_line_too_long", "message": "…"}]}}``."""
    from core.api.errors import field_error_body  # in a worker, after the application (Django) loaded

    code = GUNICORN_ERROR_CODES.get(status_int, "error")
    message = f"{reason}: {mesg}" if mesg else reason
    body = json.dumps(field_error_body(GUNICORN_ERROR_FIELDS.get(status_int), code, message, status_int,
                                       code)).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin1") + body)


util.write_error = write_json_error
