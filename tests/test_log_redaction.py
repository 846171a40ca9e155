"""Nothing a person must not read reaches a log (issue 11 #6, docs/ARCHITECTURE.md §10): phone numbers and
emails are masked, and a sensitive notification's content is removed, in messages, arguments and
tracebacks, of every process: the pytest process's records (caplog), Celery's handlers, and the
access log of the ``Procfile``'s gunicorn."""

from __future__ import annotations

import logging
import os
import subprocess
import uuid

import pytest
import requests

from bench.stack import LOG_DIR, ROOT, free_port, procfile_command, wait_until
from core import redaction
from notifications.delivery import checks
from notifications.delivery.pipeline import send_notifications
from notifications.models import Notification
from preferences.models import Recipient

PHONE = "+4915112345678"
EMAIL = "alice.liddell@example.com"
SUBJECT = "Your sign-in code 493817"
BODY = "Use 493817 to sign in.\nIt expires in 10 minutes."
log = logging.getLogger("tests.redaction")


def assert_clean(text: str) -> None:
    for secret in (PHONE, "4915112345678", EMAIL, "alice.liddell", SUBJECT, "493817", "It expires in 10 minutes"):
        assert secret not in text, f"{secret!r} in {text!r}"


def test_contacts_are_masked_in_messages_arguments_and_tracebacks(caplog):
    caplog.set_level(logging.INFO, logger="tests.redaction")
    log.info("sms to %s and email to %s failed", PHONE, EMAIL)
    log.warning(f"inline: {PHONE} / {EMAIL} / +49 151 1234 5678")
    try:
        raise ValueError(f"provider refused {EMAIL} and {PHONE}")
    except ValueError:
        log.exception("send crashed")

    assert_clean(caplog.text)
    assert "sms to +49*****78 and email to a***@example.com failed" in caplog.text
    assert "inline: +49*****78 / a***@example.com / +49*****78" in caplog.text
    assert "ValueError: provider refused a***@example.com and +49*****78" in caplog.text
    assert all(record.exc_info is None for record in caplog.records)  # only the masked text is kept
    assert "4915112345678" not in repr([(r.msg, r.args, r.exc_text) for r in caplog.records])


def test_masking_keeps_what_is_not_a_contact():
    text = "at 2030-03-01T09:00:00+01:00 took +120 ms, id 3f2c; limit 6000/min"
    assert redaction.mask_contacts(text) == text
    assert redaction.mask_contacts("GET /admin/?q=%2B49+151+1234+5678&u=bob%40example.org") == \
        "GET /admin/?q=%2B49*****78&u=b***%40example.org"


# --- issue 12 #4: phone-like digit runs, URL-encoded text, internationalised domains -------------------

@pytest.mark.parametrize(("text", "masked"), [
    # Separators (spaces, dashes, dots, slashes, parentheses) and the "(0)" of a national prefix.
    ("+1 (415) 555-0100", "+14*****00"),
    ("+49 (0)151 12345678", "+49*****78"),
    ("+49 151/1234-5678", "+49*****78"),
    ("+44 20 7946 0958", "+44*****58"),
    # National formats and numbers written without "+".
    ("015112345678", "*****78"),
    ("0151 1234 5678", "*****78"),
    ("(415) 555-0100", "*****00"),
    ("415-555-0100", "*****00"),
    ("4915112345678", "*****78"),
    ("0049 151 12345678", "*****78"),
])
def test_phone_like_digit_runs_keep_only_their_last_two_digits(text, masked):
    assert redaction.mask_contacts(f"support searched {text} today") == f"support searched {masked} today"


@pytest.mark.parametrize(("text", "masked"), [
    ("q=%2B1+%28415%29+555-0100", "q=%2B14*****00"),
    ("q=%2B49+%280%29151+12345678", "q=%2B49*****78"),
    ("q=015112345678", "q=*****78"),
    ("q=0151%2012345678", "q=*****78"),
    ("q=%2B4915112345678&page=2", "q=%2B49*****78&page=2"),
    ("q=carol.smith%40b%C3%BCcher.de", "q=c***%40b%C3%BCcher.de"),
    ("/v1/users/carol.smith%40b%C3%BCcher.de/devices", "/v1/users/c***%40b%C3%BCcher.de/devices"),
    ("q=alice%2Btag%40example.com", "q=a***%40example.com"),
])
def test_url_encoded_contacts_are_masked_as_decoded(text, masked):
    assert redaction.mask_contacts(f'"GET /admin/?{text} HTTP/1.1" 200') == f'"GET /admin/?{masked} HTTP/1.1" 200'


@pytest.mark.parametrize(("text", "masked"), [
    ("carol.smith@bücher.de", "c***@bücher.de"),
    ("josé@correo.españa.es", "j***@correo.españa.es"),
    ("user@xn--bcher-kva.de", "u***@xn--bcher-kva.de"),
    ("ivan@пример.рф", "i***@пример.рф"),
    ("alice+tag@example.com", "a***@example.com"),
])
def test_internationalised_emails_are_masked(text, masked):
    assert redaction.mask_contacts(f"bounce for {text}.") == f"bounce for {masked}."


@pytest.mark.parametrize("text", [
    "at 2030-03-01T09:00:00+01:00 took +120 ms, id 3f2c; limit 6000/min",
    "[01/Mar/2030:09:00:00 +0000] 2030-03-01 09:00:00,123 01.03.2030 09:00",
    "notification 123e4567-e89b-12d3-a456-426614174000 and 12345678-1234-1234-1234-123456789012",
    "from 192.168.100.200 in 0.123456789 s, 1234.56789 ms, pid 4711, 5242880 bytes",
    "SM0123456789abcdef0123456789abcdef sent; sg id 14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0",
])
def test_masking_keeps_dates_ids_addresses_and_measurements(text):
    assert redaction.mask_contacts(text) == text


def test_a_support_search_reaches_the_log_masked(caplog):
    caplog.set_level(logging.INFO, logger="tests.redaction")
    for query in ("%2B1+%28415%29+555-0100", "%2B49+%280%29151+12345678", "carol.smith%40b%C3%BCcher.de",
                  "015112345678", "carol.smith@bücher.de"):
        log.warning("Not Found: /admin/preferences/recipient/?q=%s", query)
    for leaked in ("415", "5550100", "555-0100", "12345678", "carol", "smith", "0151"):
        assert leaked not in caplog.text, leaked


def _notification(sensitive: bool, priority: str = "high") -> Notification:
    r = Recipient.objects.create(user_id=f"red-{uuid.uuid4().hex[:8]}", email=EMAIL, phone=PHONE)
    return Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="email", priority=priority,
                                       title=SUBJECT, body=BODY, sensitive=sensitive, status="queued")


@pytest.fixture
def crashing_checks(monkeypatch):
    """The checks before the call crash with the content and contacts in the exception's message (as
    Django's BadHeaderError quotes a subject)."""

    def broken(n, stopped_phones=None, kind=None):
        raise ValueError(f"Header values can't contain newlines (got {n.title!r}, {n.body!r}) "
                         f"for {n.recipient.email} / {n.recipient.phone}")

    monkeypatch.setattr(checks, "suppression_reason", broken)


@pytest.mark.django_db
@pytest.mark.parametrize("priority", ["high", "standard"])  # the single and the batch path
def test_a_sensitive_notifications_content_never_reaches_the_worker_log(caplog, crashing_checks, priority):
    caplog.set_level(logging.INFO)
    n = _notification(sensitive=True, priority=priority)

    send_notifications([str(n.pk)])

    n.refresh_from_db()
    assert (n.status, n.reason) == ("scheduled", "worker_error")  # it did crash, and was logged
    assert "checks of" in caplog.text and "ValueError: Header values" in caplog.text
    assert_clean(caplog.text)
    assert "[sensitive]" in caplog.text
    assert SUBJECT not in n.reason_detail and "493817" not in n.reason_detail  # shown to support


@pytest.mark.django_db
def test_content_that_is_not_sensitive_stays_readable_with_contacts_masked(caplog, crashing_checks):
    caplog.set_level(logging.INFO)
    n = _notification(sensitive=False)

    send_notifications([str(n.pk)])

    assert SUBJECT in caplog.text
    assert PHONE not in caplog.text and EMAIL not in caplog.text


def test_an_exception_from_a_sensitive_scope_is_redacted_when_logged_after_it(caplog):
    class Row:
        title, body, html = SUBJECT, BODY, ""

    with pytest.raises(RuntimeError) as raised, redaction.sensitive_content([Row()]):
        raise RuntimeError(f"render failed: {BODY!r}")
    log.error("task failed: %s", raised.value, exc_info=raised.value)  # e.g. Celery's task failure line

    assert_clean(caplog.text)
    assert "task failed: render failed: '[sensitive]'" in caplog.text


def test_every_handler_filters(settings):
    assert all("redact" in h.get("filters", []) for h in settings.LOGGING["handlers"].values())
    assert settings.LOGGING_CONFIG == "core.redaction.configure_logging"
    console = [h for h in logging.getLogger().handlers if type(h) is logging.StreamHandler]
    assert console and all(any(isinstance(f, redaction.RedactingFilter) for f in h.filters) for h in console)

    from celery.signals import after_setup_task_logger

    task_logger = logging.getLogger(f"tests.celery-task-{uuid.uuid4().hex[:6]}")
    handler = logging.StreamHandler()
    task_logger.addHandler(handler)
    after_setup_task_logger.send(sender=None, logger=task_logger, loglevel=logging.INFO, logfile=None,
                                 format="", colorize=False)
    assert any(isinstance(f, redaction.RedactingFilter) for f in handler.filters)


def test_the_gunicorn_access_log_masks_searched_numbers_and_emails(tmp_path):
    """The Procfile's web process: a support agent's admin searches by phone and email, and an API
    path with an email, as they appear in gunicorn's access log (and Django's warnings)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "SENDGRID_", "FCM_", "SMTP_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "PORT": str(port),
                "PUBLIC_BASE_URL": f"http://127.0.0.1:{port}", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / "redaction-web.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(procfile_command("web", port), cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(f"{base}/healthz"), 60, interval=0.2, message="the web process")
        paths = ["/admin/notifications/notification/?q=%2B4915112345678",
                 "/admin/preferences/recipient/?q=%2B49+151+1234+5678",
                 "/admin/preferences/recipient/?q=alice.liddell%40example.com",
                 "/v1/users/alice.liddell@example.com",
                 "/admin/preferences/recipient/?q=%2B1+%28415%29+555-0100",
                 "/admin/preferences/recipient/?q=carol.smith%40b%C3%BCcher.de",
                 "/admin/preferences/recipient/?q=015112345678"]
        for path in paths:
            assert requests.get(base + path, timeout=10, allow_redirects=False).status_code in (302, 401)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    text = log_path.read_text()
    # every request is in the access log (besides the readiness polls of /healthz, one or more)
    assert text.count('"GET /') - text.count('"GET /healthz ') == len(paths), text
    assert_clean(text)
    assert "alice.liddell%40" not in text
    assert '"GET /admin/notifications/notification/?q=%2B49*****78 HTTP/1.1" 302' in text
    assert '"GET /admin/preferences/recipient/?q=%2B49*****78 HTTP/1.1" 302' in text
    assert '"GET /admin/preferences/recipient/?q=a***%40example.com HTTP/1.1" 302' in text
    assert '"GET /v1/users/a***@example.com HTTP/1.1" 401' in text
    assert '"GET /admin/preferences/recipient/?q=%2B14*****00 HTTP/1.1" 302' in text
    assert '"GET /admin/preferences/recipient/?q=c***%40b%C3%BCcher.de HTTP/1.1" 302' in text
    assert '"GET /admin/preferences/recipient/?q=*****78 HTTP/1.1" 302' in text
    for leaked in ("415", "555-0100", "carol.smith", "015112345678"):
        assert leaked not in text, leaked


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.parametrize(("text", "masked"), [
    ('"GET /u/eyJ1IjoiYSJ9:1t2:Ab_c-d HTTP/1.1" 200', '"GET /u/[token] HTTP/1.1" 200'),
    ("Not Found: /u/abc.def", "Not Found: /u/[token]"),
    ('"https://notify.example.com/u/abc?x=1"', '"https://notify.example.com/u/[token]?x=1"'),
    ("/v1/users/u/notifications", "/v1/users/u/notifications"),  # a user id "u", not the unsubscribe path
    # Spellings that still route to the view (Django decodes the path) or name it (adversary: logged raw).
    ('"POST /%75/eyJ1IjoiYSJ9:1t2:Ab HTTP/1.1" 200', '"POST /%75/[token] HTTP/1.1" 200'),
    ('"GET //u/eyJ1IjoiYSJ9:1t2:Ab HTTP/1.1" 404', '"GET //u/[token] HTTP/1.1" 404'),
    ('"GET /u%2Feyj:1t2:Ab HTTP/1.1"', '"GET /u%2F[token] HTTP/1.1"'),
    ('"GET /U/eyj:1t2:Ab HTTP/1.1"', '"GET /U/[token] HTTP/1.1"'),
    ('"GET /u/eyJ1%3A1t2:Ab HTTP/1.1"', '"GET /u/[token] HTTP/1.1"'),
])
def test_unsubscribe_tokens_are_masked(text, masked):
    assert redaction.redact(text) == masked
