"""gunicorn settings of the web process (``Procfile``: ``gunicorn -c config/gunicorn_conf.py``).

* **Logging**: gunicorn's error and access logs are its own handlers, not Django's, so they get the
  redaction (core/redaction.py) here. An access-log line holds the request's path and query string
  (a support agent's ``/admin/…/?q=%2B4915112345678``, a one-click ``/u/<token>``): numbers and
  emails are masked in it, URL-encoded or not, and an unsubscribe token reads ``/u/[token]``.
* **Keep-alive**: :data:`keepalive` seconds (default 75, ``GUNICORN_KEEPALIVE``), longer than a load
  balancer's idle timeout (AWS ALB: 60 s; nginx's upstream keepalive_timeout: 60 s), so the balancer
  always closes an idle connection first: with gunicorn's default of 2 s, a client or balancer
  reusing a connection gunicorn had just closed got a reset. The threaded worker (``--threads``,
  gthread) parks idle connections (nothing sent yet, or between requests) in its poller, so they
  hold no thread; a connection that has *started* a request holds a thread while it is read.
* **Reads are bounded** (:data:`worker_class`, config/gunicorn_worker.py): a read of a request waits
  at most ``GUNICORN_READ_TIMEOUT`` seconds (5) for the client's next bytes, so a client that stops
  mid-headers or mid-body (slowloris) is dropped and its thread freed. This bounds each wait, not a
  trickle: production runs behind a buffering reverse proxy (docs/OPERATIONS.md, docs/SECURITY.md).
* **Errors gunicorn answers itself** (a request line over ``limit_request_line``, 4094 bytes: 414; a
  header over ``limit_request_field_size``, 8190 bytes, or more than 100 headers: 431; a malformed
  request: 400) are in the API's JSON error shape (``core.api.errors.field_error_body``, the one
  builder), not gunicorn's HTML page: :func:`write_json_error`
  replaces gunicorn's writer of those pages. The limits stay gunicorn's defaults (no API request
  needs more; the admin's longest query strings are well under 4 KB).

Everything else stays on the command line (bind, workers, threads). Docs: docs/OPERATIONS.md ("The
web process").
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
