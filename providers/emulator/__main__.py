"""``python -m providers.emulator [--host ADDRESS] [--port N] [--smtp-port N]``.

Environment: EMULATOR_HOST (default 127.0.0.1; a test host's address in a network namespace, so a
second host's workers reach it: tests/test_e2e_two_hosts.py), EMULATOR_PORT (default 8900),
EMULATOR_SMTP_PORT (default 8925), EMULATOR_RECORD_FILE
(append accepted messages as JSON lines), EMULATOR_MAX_MESSAGES (in-memory cap, default 200000,
0 = unlimited), EMULATOR_LOG_LEVEL (default INFO), EMULATOR_RECEIPTS (``0`` turns all delivery
receipts off; default on), EMULATOR_SENDGRID_EVENTS_URL (where SendGrid Event Webhook batches are
POSTed; unset = no events), EMULATOR_SENDGRID_SIGNING_KEY_FILE (PEM P-256 private key signing them;
unset = a key generated at start, see ``GET /_emulator/sendgrid/public-key``), EMULATOR_ENGAGEMENT (the
simulated engagement model as JSON, ``engagement.py``; unset = off), CLOCK_OFFSET_FILE (the test clock
offset the emulator's clock follows, ``clock.py``). Command-line flags win over the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys

from providers.emulator.engagement import Engagement
from providers.emulator.server import serve
from providers.emulator.signing import SigningKeyError

OFF = ("0", "false", "no", "off")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m providers.emulator",
        description="Local emulator of the Twilio, SendGrid, FCM and SMTP provider APIs (127.0.0.1 by default).",
    )
    parser.add_argument("--host", default=os.environ.get("EMULATOR_HOST") or "127.0.0.1",
                        help="address to listen on (env EMULATOR_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("EMULATOR_PORT", 8900)),
                        help="HTTP port (env EMULATOR_PORT, default 8900)")
    parser.add_argument("--smtp-port", type=int, default=int(os.environ.get("EMULATOR_SMTP_PORT", 8925)),
                        help="SMTP port (env EMULATOR_SMTP_PORT, default 8925)")
    parser.add_argument("--record-file", default=os.environ.get("EMULATOR_RECORD_FILE") or None,
                        help="append each accepted message as a JSON line (env EMULATOR_RECORD_FILE)")
    parser.add_argument("--max-messages", type=int, default=int(os.environ.get("EMULATOR_MAX_MESSAGES", 200_000)),
                        help="messages kept in memory, oldest dropped first; 0 = unlimited")
    parser.add_argument("--no-receipts", dest="receipts", action="store_false",
                        default=os.environ.get("EMULATOR_RECEIPTS", "1").strip().lower() not in OFF,
                        help="send no status callbacks / events (env EMULATOR_RECEIPTS=0)")
    parser.add_argument("--sendgrid-events-url", default=os.environ.get("EMULATOR_SENDGRID_EVENTS_URL") or None,
                        help="POST SendGrid Event Webhook batches here; loopback URLs only "
                             "(env EMULATOR_SENDGRID_EVENTS_URL)")
    parser.add_argument("--sendgrid-signing-key-file",
                        default=os.environ.get("EMULATOR_SENDGRID_SIGNING_KEY_FILE") or None,
                        help="PEM P-256 private key for the Event Webhook signature "
                             "(env EMULATOR_SENDGRID_SIGNING_KEY_FILE; default: generated at start)")
    parser.add_argument("--engagement", default=os.environ.get("EMULATOR_ENGAGEMENT") or None,
                        help="simulated engagement model, JSON (env EMULATOR_ENGAGEMENT; default off)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("EMULATOR_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        engagement = Engagement.from_json(json.loads(args.engagement)) if args.engagement else None
        asyncio.run(serve(args.port, args.smtp_port, args.record_file, args.max_messages,
                          receipts=args.receipts, sendgrid_events_url=args.sendgrid_events_url,
                          sendgrid_signing_key_file=args.sendgrid_signing_key_file, host=args.host,
                          engagement=engagement, clock_offset_file=os.environ.get("CLOCK_OFFSET_FILE") or None))
    except (OSError, SigningKeyError, ValueError) as exc:
        logging.getLogger("providers.emulator").error("cannot start: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
