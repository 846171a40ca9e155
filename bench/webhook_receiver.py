"""The calling service's end of ``manage.py bench --webhooks``: a threaded HTTP receiver of status webhooks.

Each POST is verified with the ``standardwebhooks`` library as a receiver would (docs/WEBHOOKS.md),
counted by ``webhook-id`` and event type with its first arrival, and answered 204 (a bad signature:
400, counted as rejected). :meth:`Receiver.down` closes the port and every open connection for S
seconds (the sender sees refused connections), then listens again. :func:`tally` compares what was
received with what the outbox holds. Run as ``python -m bench.webhook_receiver --port P
--control-port C --secret-file F``: ``GET /``, ``GET /summary``, ``POST /down?seconds=S`` on the control port.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from standardwebhooks import Webhook, WebhookVerificationError


class Receiver:
    """``received``: ``{webhook-id: [event type, data.at in ms, first arrival in ms, arrivals]}``."""

    def __init__(self, secret: str, port: int = 0) -> None:
        self.verifier = Webhook(secret)
        self.received: dict[str, list] = {}
        self.rejected = 0
        self.outages: list[dict[str, float]] = []
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._server = self._listen(port)
        self.port = self._server.server_address[1]

    def _listen(self, port: int) -> ThreadingHTTPServer:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the webhook worker's connection expects

            def setup(self):
                super().setup()
                with receiver._lock:
                    receiver._open.add(self.connection)

            def finish(self):
                with receiver._lock:
                    receiver._open.discard(self.connection)
                super().finish()

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                code = receiver.accept(body, {k.lower(): v for k, v in self.headers.items()})
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True).start()
        return server

    def accept(self, body: bytes, headers: dict[str, str]) -> int:
        """Verify and count one delivery; the HTTP status to answer."""
        now_ms = time.time() * 1000
        try:
            event = self.verifier.verify(body, headers)
        except WebhookVerificationError:
            with self._lock:
                self.rejected += 1
            return 400
        at = (event.get("data") or {}).get("at") or event.get("timestamp")
        at_ms = datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() * 1000 if at else None
        with self._lock:
            seen = self.received.get(headers["webhook-id"])
            if seen is None:
                self.received[headers["webhook-id"]] = [event["type"], at_ms, now_ms, 1]
            else:
                seen[3] += 1
        return 204

    def down(self, seconds: float) -> None:
        """Refuse connections for ``seconds``: the port closed, open connections shut; then listen again."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for conn in list(self._open):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        outage = {"down_ms": time.time() * 1000, "up_ms": 0.0}
        self.outages.append(outage)

        def back() -> None:
            self._server = self._listen(self.port)
            outage["up_ms"] = time.time() * 1000

        timer = threading.Timer(seconds, back)
        timer.daemon = True
        timer.start()

    def summary(self) -> dict:
        """Counts only (the bench polls this every second; :meth:`state` is every id)."""
        with self._lock:
            return {"ids": len(self.received), "arrivals": sum(v[3] for v in self.received.values()),
                    "rejected": self.rejected}

    def state(self) -> dict:
        with self._lock:
            return {"received": {k: list(v) for k, v in self.received.items()}, "rejected": self.rejected,
                    "outages": [dict(o) for o in self.outages]}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def tally(expected: dict[str, str], state: dict) -> dict:
    """What was received of ``expected`` (``{webhook-id: event type}``, from the outbox): expected,
    received, duplicates (arrivals beyond the first: at least once allows them), lost (expected, never
    received: must be 0), unexpected ids, rejected signatures, and the same per event type."""
    received = state["received"]
    by_type: dict[str, dict[str, int]] = {}
    for msg_id, event_type in expected.items():
        row = by_type.setdefault(event_type, {"expected": 0, "received": 0, "duplicates": 0, "lost": 0})
        row["expected"] += 1
        got = received.get(msg_id)
        if got is None:
            row["lost"] += 1
        else:
            row["received"] += 1
            row["duplicates"] += got[3] - 1
    lost = sorted(set(expected) - set(received))
    return {"expected": len(expected), "received": sum(r["received"] for r in by_type.values()),
            "duplicates": sum(r["duplicates"] for r in by_type.values()), "lost": len(lost), "lost_ids": lost[:20],
            "unexpected": len(set(received) - set(expected)), "rejected": state["rejected"],
            "by_type": dict(sorted(by_type.items()))}


def _control(receiver: Receiver, port: int) -> ThreadingHTTPServer:
    class Control(BaseHTTPRequestHandler):
        def _json(self, data: dict) -> None:
            body = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._json(receiver.summary() if urlsplit(self.path).path == "/summary" else receiver.state())

        def do_POST(self):
            seconds = float(parse_qs(urlsplit(self.path).query).get("seconds", ["0"])[0])
            receiver.down(seconds)
            self._json({"down_for": seconds})

        def log_message(self, *args):
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Control)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--secret-file", required=True)
    args = parser.parse_args()
    receiver = Receiver(Path(args.secret_file).read_text().strip(), args.port)
    _control(receiver, args.control_port).serve_forever()


if __name__ == "__main__":
    main()
