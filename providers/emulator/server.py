"""Run the emulator: one asyncio loop serving HTTP (aiohttp) and SMTP (aiosmtpd) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web
from aiosmtpd.smtp import SMTP

from providers.emulator import fcm_api, inspection, sendgrid_api, twilio_api
from providers.emulator.clock import OffsetClock
from providers.emulator.context import EMULATOR_KEY, Emulator
from providers.emulator.engagement import Engagement
from providers.emulator.signing import EventWebhookSigner
from providers.emulator.smtp_sink import SmtpSink, authenticate_any
from providers.emulator.store import MessageStore
from providers.emulator.webhooks import Webhooks, is_loopback_url

logger = logging.getLogger("providers.emulator")

#: The address it listens on: loopback, unless a test host's address is given (``--host``).
HOST = "127.0.0.1"
#: Largest request body accepted (SendGrid allows 30 MB mails).
MAX_BODY_BYTES = 32 * 1024 * 1024
#: Seconds in-flight requests (e.g. ones held by a latency fault) get to finish at shutdown.
SHUTDOWN_GRACE_SECONDS = 0.5


def build_app(emulator: Emulator) -> web.Application:
    """The aiohttp application with every provider route and the inspection API."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[EMULATOR_KEY] = emulator
    for module in (twilio_api, sendgrid_api, fcm_api, inspection):
        module.add_routes(app)
    app.on_cleanup.append(_close_webhooks)
    return app


async def _close_webhooks(app: web.Application) -> None:
    await app[EMULATOR_KEY].webhooks.close()


async def serve(
    port: int,
    smtp_port: int,
    record_file: str | None = None,
    max_messages: int = 0,
    stop: asyncio.Event | None = None,
    receipts: bool = True,
    sendgrid_events_url: str | None = None,
    sendgrid_signing_key_file: str | None = None,
    host: str = HOST,
    engagement: Engagement | None = None,
    clock_offset_file: str | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or until ``stop`` is set), then shut down cleanly, on ``host``.

    ``receipts=False`` sends no status callbacks or events at all; ``sendgrid_events_url`` is where
    SendGrid Event Webhook batches go (``None``: no events); ``sendgrid_signing_key_file`` is a PEM
    P-256 private key to sign them with (``None``: a key generated at start); ``engagement`` the
simulated opens at start (``None``: off; the control API changes it); ``clock_offset_file`` the test
clock offset the emulator's clock follows (``clock.py``).

    Raises:
        OSError: a port is already in use, or the key file cannot be read.
        SigningKeyError: the key file holds no unencrypted P-256 private key.
    """
    # aiosmtpd logs every SMTP command at INFO: far too costly per message.
    logging.getLogger("mail.log").setLevel(logging.WARNING)
    signer = EventWebhookSigner.from_pem_file(sendgrid_signing_key_file) if sendgrid_signing_key_file else None
    webhooks = Webhooks(enabled=receipts, sendgrid_url=sendgrid_events_url, signer=signer)
    if receipts and sendgrid_events_url and not is_loopback_url(sendgrid_events_url):
        logger.warning("EMULATOR_SENDGRID_EVENTS_URL %s is not a loopback URL: every event will be refused",
                       sendgrid_events_url)
    emulator = Emulator(store=MessageStore(max_messages=max_messages, record_path=record_file),
                        webhooks=webhooks, clock=OffsetClock(clock_offset_file), engagement=engagement)
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    runner = web.AppRunner(build_app(emulator), access_log=None, handle_signals=False,
                           shutdown_timeout=SHUTDOWN_GRACE_SECONDS)
    await runner.setup()
    smtp_server = None
    try:
        await web.TCPSite(runner, host, port).start()
        handler = SmtpSink(emulator)
        smtp_server = await loop.create_server(
            lambda: SMTP(handler, hostname="emulator.local", ident="provider-emulator",
                         authenticator=authenticate_any, auth_require_tls=False, loop=loop),
            host, smtp_port,
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        logger.info("provider emulator listening on http://%s:%d (smtp %d)", host, port, smtp_port)
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if smtp_server is not None:
            smtp_server.close()
        await runner.cleanup()
        emulator.store.close()
        logger.info("provider emulator stopped")
