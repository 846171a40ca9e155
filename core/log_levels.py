"""Log levels by whose problem a response is (``settings.LOGGING``, docs/OPERATIONS.md "Logs").

Django's ``django.request`` logs every 4xx at WARNING and every 5xx at ERROR. A 4xx is the client's
problem (a bad field, an unknown id, a missing scope): at WARNING, 150 refused sends are 150
warnings an operator learns to ignore, hiding the ones that matter. :class:`ClientErrorsAtInfo`, a
filter on that logger, lowers 4xx records to INFO and leaves 5xx at ERROR. The API audit log
(``APIAuditEntry``) still records every write and its outcome, 4xx included. A refused admin
lookup (``django.security.DisallowedModelAdminLookup``/``…ToField``, a probe) is one WARNING line
(:class:`SuspiciousRequestsAtWarning`). Neither logs the refusal's traceback.
"""

from __future__ import annotations

import logging


class ClientErrorsAtInfo(logging.Filter):
    """A logger filter: a record of a 4xx response (``status_code`` in its extra, as
    ``django.utils.log.log_response`` sets it) becomes :attr:`level` (INFO), and is dropped unless that
    level is enabled both for its logger and for the root (``LOG_LEVEL``: ``WARNING`` drops them); its
    traceback is dropped too (a refused request, e.g. the admin's 400 ``BadRequest`` for
    ``?id=not-a-uuid``, is one line, not fifty). Every other record passes unchanged."""

    level = logging.INFO

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if not isinstance(status, int) or not 400 <= status < 500:
            return True
        record.exc_info, record.exc_text = None, None
        if record.levelno <= self.level:
            return True
        record.levelno, record.levelname = self.level, logging.getLevelName(self.level)
        return all(logger.isEnabledFor(self.level) for logger in (logging.getLogger(record.name),
                                                                  logging.getLogger()))


class SuspiciousRequestsAtWarning(ClientErrorsAtInfo):
    """For ``django.security.<SuspiciousOperation>`` loggers (a filter on each: a logger's filters
    never see its children's records): Django logs the 400 it answers at ERROR with the traceback;
    a probe (``?body__startswith=`` in the admin) is worth a WARNING line, not an ERROR and a
    traceback."""

    level = logging.WARNING
