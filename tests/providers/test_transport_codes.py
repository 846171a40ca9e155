"""providers.base.transport_code: which failures to get an answer leave the outcome unknown."""

from __future__ import annotations

import http.client
import urllib.error

import aiohttp
import httpx
import pytest
import requests
import urllib3

from providers.base import TransientProviderError, transport_code


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


@pytest.mark.parametrize(("exc", "code"), [
    (requests.exceptions.ReadTimeout("read timed out"), "timeout"),
    (urllib.error.URLError(TimeoutError("timed out")), "timeout"),
    # requests wraps urllib3's ProtocolError(RemoteDisconnected): the server closed after our request
    (requests.exceptions.ConnectionError(urllib3.exceptions.ProtocolError(
        "Connection aborted.", http.client.RemoteDisconnected("closed without response"))), "connection_lost"),
    (urllib.error.URLError(ConnectionResetError(104, "Connection reset by peer")), "connection_lost"),
    (chained(OSError("send failed"), BrokenPipeError(32, "Broken pipe")), "connection_lost"),
    # refused: the request never left
    (requests.exceptions.ConnectionError(urllib3.exceptions.NewConnectionError(
        None, "Failed to establish a new connection: [Errno 111] Connection refused")), "connection_error"),
    (urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")), "connection_error"),
    # the async paths: httpx (FCM) and aiohttp (Twilio, and FCM's aiohttp transport)
    (httpx.ReadTimeout("timed out"), "timeout"),
    (httpx.RemoteProtocolError("Server disconnected without sending a response."), "connection_lost"),
    (chained(httpx.ReadError("read failed"), ConnectionResetError(104, "reset")), "connection_lost"),
    (httpx.ConnectError("All connection attempts failed"), "connection_error"),
    (aiohttp.ServerTimeoutError("Timeout on reading data from socket"), "timeout"),
    (aiohttp.ServerDisconnectedError(), "connection_lost"),
    (aiohttp.ClientPayloadError("Response payload is not completed"), "connection_lost"),
])
def test_transport_codes(exc, code):
    assert transport_code(exc) == code


@pytest.mark.parametrize(("code", "unknown"), [("timeout", True), ("connection_lost", True),
                                               ("connection_error", False), ("503", False), ("20429", False)])
def test_which_codes_leave_the_outcome_unknown(code, unknown):
    from notifications.delivery.outcomes import outcome_unknown

    assert outcome_unknown(TransientProviderError("twilio", code, "x")) is unknown
