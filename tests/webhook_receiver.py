"""A tiny HTTP server standing in for a calling service's webhook endpoint: it records every request
(headers, body, the status it answered) and answers from a script (status, headers), for the
status-webhook tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """``answer(request_number) -> (status, headers[, body])`` decides each answer (default 200, "ok")."""

    def __init__(self, answer: Callable[[int], tuple[int, dict]] | None = None) -> None:
        self.requests: list[dict] = []
        self.answer = answer or (lambda _n: (200, {}))
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    number = len(receiver.requests) + 1
                    status, headers, *rest = receiver.answer(number)
                    record = {"path": self.path, "headers": dict(self.headers.items()), "body": body,
                              "answered": status, "write_error": None}
                    receiver.requests.append(record)
                answer = rest[0] if rest else b"ok"
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                try:
                    self.wfile.write(answer)
                    self.wfile.flush()
                except OSError as exc:  # the client stopped reading and closed
                    record["write_error"] = type(exc).__name__

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
