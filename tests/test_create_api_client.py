"""``manage.py create_api_client``: a name is taken once (a second client of the same name owned
nothing of the first's and could not be told apart); ``--rotate`` replaces a client's key in place."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from notifications.models import APIClient

pytestmark = pytest.mark.django_db


def create(*args: str) -> tuple[str, str]:
    """(first line of output, the key: the last line)."""
    out = io.StringIO()
    call_command("create_api_client", *args, stdout=out)
    lines = out.getvalue().splitlines()
    return lines[0], lines[-1]


def answer(key: str) -> tuple[int, str]:
    """A read with ``key``: 404 for a known key (no such user), 401 with the error code for another."""
    r = Client(headers={"Authorization": f"Api-Key {key}"}).get("/v1/users/nobody-here")
    return r.status_code, r.json()["error"]["fields"][0]["code"] if r.status_code == 401 else ""


def test_a_taken_name_is_refused_and_nothing_is_created():
    """A CommandError: ``manage.py`` prints it and exits 1."""
    create("marketing-tool", "--scopes", "read")
    with pytest.raises(CommandError) as refused:
        create("marketing-tool", "--scopes", "segments:write,read")
    assert str(refused.value) == ("an API client named 'marketing-tool' already exists; to replace its key "
                                  "(the old one stops working): create_api_client marketing-tool --rotate")
    assert list(APIClient.objects.values_list("name", "scopes")) == [("marketing-tool", ["read"])]


def test_rotate_gives_the_same_client_a_new_key_and_the_old_one_stops_working():
    _, old = create("user-service", "--scopes", "recipients:write,read", "--rate-limit", "60/min")
    before = APIClient.objects.get()
    assert answer(old) == (404, "")
    said, new = create("user-service", "--rotate")
    after = APIClient.objects.get()  # still one row: the same client
    assert (after.pk, after.prefix, after.scopes, after.rate_limit, after.revoked) == (
        before.pk, before.prefix, ["recipients:write", "read"], "60/min", False)
    assert new != old and new.startswith(f"{before.prefix}.")
    assert said == (f"New key for API client 'user-service' (prefix {before.prefix}, scopes recipients:write, "
                    "read). Store the key now; it is not shown again:")
    assert (answer(new), answer(old)) == ((404, ""), (401, "invalid_api_key"))


def test_rotate_may_change_scopes_and_rate_limit():
    create("otp", "--scopes", "read")
    create("otp", "--rotate", "--scopes", "notifications:send", "--allow-high", "--rate-limit", "10/s")
    assert list(APIClient.objects.values_list("scopes", "rate_limit")) == [
        (["notifications:send", "notifications:send_high"], "10/s")]


@pytest.mark.parametrize(("setup", "message"), [
    ([], "no API client named 'ghost' to rotate"),
    (["revoked"], "API client 'ghost' is revoked, which cannot be undone; create one under another name"),
    (["live", "live"], "2 API clients are named 'ghost' (prefixes "),
])
def test_rotate_refuses_what_it_cannot_rotate(setup, message):
    made = [APIClient.objects.create_key(name="ghost", revoked=state == "revoked")[0] for state in setup]
    hashes = sorted(c.hashed_key for c in made)
    with pytest.raises(CommandError, match=f"^{message.replace('(', '[(]')}"):
        create("ghost", "--rotate")
    assert sorted(APIClient.objects.values_list("hashed_key", flat=True)) == hashes
