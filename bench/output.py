"""Where a bench command writes its JSON: ``bench/results/<kind>-<UTC stamp>.json`` (git-ignored;
docs/PERFORMANCE.md quotes the figures, never the files)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings


def results_dir() -> Path:
    """The default output folder of every bench command."""
    return Path(settings.BASE_DIR) / "bench" / "results"


def stamp() -> str:
    """The UTC second a result is named after (``20261204T215335Z``)."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def write_json(kind: str, result: dict, out: str | Path | None = None, *, when: str | None = None,
               indent: int = 2, default=None) -> Path:
    """``result`` as ``<out>/<kind>-<when>.json`` (``out``: :func:`results_dir`; ``when``: :func:`stamp`
    now), the folder made if needed. Returns the file's path."""
    folder = Path(out) if out is not None else results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{when or stamp()}.json"
    path.write_text(json.dumps(result, indent=indent, default=default))
    return path
