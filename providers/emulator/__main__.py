"""``python -m providers.emulator [--port N] [--smtp-port N]``.

Environment: EMULATOR_PORT (default 8900), EMULATOR_SMTP_PORT (default 8925), EMULATOR_RECORD_FILE
(append accepted messages as JSON lines), EMULATOR_MAX_MESSAGES (in-memory cap, default 200000,
0 = unlimited), EMULATOR_LOG_LEVEL (default INFO). Command-line flags win over the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from providers.emulator.server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m providers.emulator",
        description="Local emulator of the Twilio, SendGrid, FCM and SMTP provider APIs (127.0.0.1 only).",
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("EMULATOR_PORT", 8900)),
                        help="HTTP port on 127.0.0.1 (env EMULATOR_PORT, default 8900)")
    parser.add_argument("--smtp-port", type=int, default=int(os.environ.get("EMULATOR_SMTP_PORT", 8925)),
                        help="SMTP port on 127.0.0.1 (env EMULATOR_SMTP_PORT, default 8925)")
    parser.add_argument("--record-file", default=os.environ.get("EMULATOR_RECORD_FILE") or None,
                        help="append each accepted message as a JSON line (env EMULATOR_RECORD_FILE)")
    parser.add_argument("--max-messages", type=int, default=int(os.environ.get("EMULATOR_MAX_MESSAGES", 200_000)),
                        help="messages kept in memory, oldest dropped first; 0 = unlimited")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("EMULATOR_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        asyncio.run(serve(args.port, args.smtp_port, args.record_file, args.max_messages))
    except OSError as exc:
        logging.getLogger("providers.emulator").error("cannot start: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
