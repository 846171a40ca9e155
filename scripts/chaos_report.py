#!/usr/bin/env python3
"""Write the chaos suite's last results (test-artifacts/chaos/*.json) into docs/RELIABILITY.md,
between the ``<!-- chaos-table -->`` markers, with the command and the run's date and commit."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "test-artifacts" / "chaos"
DOC = ROOT / "docs" / "RELIABILITY.md"
START, END = "<!-- chaos-table -->", "<!-- /chaos-table -->"


def main() -> int:
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    if not rows:
        print("no chaos results in test-artifacts/chaos/", file=sys.stderr)
        return 1
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    lines = [START, "",
             f"Last run: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit `{commit}`, "
             f"command `make test-chaos`, 2-core machine.", "",
             "| scenario | recipients + OTPs | expected | delivered | lost | duplicated (allowed) | "
             "dead-lettered | time (s) | notes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['recipients']} + {r['otps']} | {r['expected']} | {r['delivered']} | "
                     f"**{r['lost']}** | {r['duplicated']} ({r['duplicates_allowed']}) | {r['dead_lettered']} | "
                     f"{r['seconds']} | {'; '.join(r.get('notes', []))} |")
    lines += ["", END]
    text = DOC.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    DOC.write_text(head + "\n".join(lines) + tail)
    print(f"updated {DOC.relative_to(ROOT)} with {len(rows)} scenario(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
