"""The CPU a bench's own Postgres connection spent: what a measured step cost the database."""

from __future__ import annotations

import os
from pathlib import Path

from django.db import connection


def backend_cpu() -> float | None:
    """User + system CPU seconds of this connection's Postgres backend (``/proc/<pid>/stat``), or
    ``None`` when the server is not on this machine."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
