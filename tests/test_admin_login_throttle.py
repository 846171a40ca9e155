"""Admin login throttling (issue 11 #7, django-axes): after ``AXES_FAILURE_LIMIT`` failed logins for
one username from one address, the next login for that pair is refused even with the right
password; other addresses and other usernames are not affected, and a success resets the count."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client

pytestmark = pytest.mark.django_db

PASSWORD = "pw-Correct-Horse-42"


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("sam-support", password=PASSWORD, is_staff=True)


def log_in(password: str, username: str = "sam-support", address: str = "203.0.113.7"):
    client = Client(REMOTE_ADDR=address)
    response = client.post("/admin/login/?next=/admin/", {"username": username, "password": password})
    return response, client


def logged_in(client: Client) -> bool:
    return client.get("/admin/").status_code == 200


def test_the_login_after_the_failure_limit_is_refused_even_with_the_right_password(staff):
    limit = settings.AXES_FAILURE_LIMIT
    assert limit == 5  # the documented default (ADMIN_LOGIN_FAILURE_LIMIT)
    for _ in range(limit - 1):
        response, _client = log_in("wrong")
        assert response.status_code == 200  # the login form again, with its error
    response, _client = log_in("wrong")  # the Nth failure locks the pair
    assert response.status_code == 429

    response, client = log_in(PASSWORD)  # the N+1th, with the right password
    assert response.status_code == 429
    assert b"Account locked: too many login attempts" in response.content
    assert not logged_in(client)

    other_address, client = log_in(PASSWORD, address="198.51.100.4")
    assert other_address.status_code == 302 and logged_in(client)


def test_another_username_from_the_same_address_is_not_locked(staff, django_user_model):
    django_user_model.objects.create_user("mia-marketing", password=PASSWORD, is_staff=True)
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in("wrong")
    response, client = log_in(PASSWORD, username="mia-marketing")
    assert response.status_code == 302 and logged_in(client)


def test_a_successful_login_resets_the_failure_count(staff):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        log_in("wrong")
    response, _client = log_in(PASSWORD)
    assert response.status_code == 302
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert log_in("wrong")[0].status_code == 200
    response, client = log_in(PASSWORD)
    assert response.status_code == 302 and logged_in(client)
