"""Log levels by whose problem a response is (``settings.LOGGING``, docs/OPERATIONS.md "Logs").

Django's ``django.request`` logs every 4xx at WARNING and every 5xx at ERROR. A 4xx is the client's
problem (a bad field, an unknown id, a missing scope): at WARNING, 150 refused sends are 150
warnings an operator learns to ignore, hiding the ones that matter. :class:`ClientErrorsAtInfo`, a
filter on that logger, lowers 4xx records to INFO and leaves 5xx at ERROR. The API audit log
(``APIAuditEntry``) still records every write and its outcome, 4xx included; ``django.security.*``
(suspicious requests) keeps its own levels.
"""

from __future__ import annotations

import logging


class ClientErrorsAtInfo(logging.Filter):
    """A logger filter: a record of a 4xx response (``status_code`` in its extra, as
    ``django.utils.log.log_response`` sets it) becomes INFO, and is dropped unless INFO is enabled
    both for its logger and for the root (``LOG_LEVEL``: ``WARNING`` drops them); every other record
    passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if not isinstance(status, int) or not 400 <= status < 500 or record.levelno <= logging.INFO:
            return True
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return all(logger.isEnabledFor(logging.INFO) for logger in (logging.getLogger(record.name),
                                                                     logging.getLogger()))
