"""gunicorn settings of the web process (``Procfile``: ``gunicorn -c config/gunicorn_conf.py``).

Only logging: gunicorn's error and access logs are its own handlers, not Django's, so they get
the redaction (config/redaction.py) here. An access-log line holds the request's path and query
string (a support agent's ``/admin/…/?q=%2B4915112345678``): numbers and emails are masked in it,
URL-encoded or not. Everything else stays on the command line (bind, workers, threads).
"""

import sys
from pathlib import Path

from gunicorn import glogging

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the config package, before Django

from core.redaction import add_filter, install_record_factory

install_record_factory()


class RedactingLogger(glogging.Logger):
    """gunicorn's logger with a :class:`core.redaction.RedactingFilter` on every handler of its
    error and access logs (set up again on every reopen)."""

    def setup(self, cfg):
        super().setup(cfg)
        add_filter(self.error_log.handlers)
        add_filter(self.access_log.handlers)


logger_class = RedactingLogger
