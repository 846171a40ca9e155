"""``manage.py create_staff_user NAME --role support [--role product] [--email E] [--password P]``:
a staff user (not a superuser) in the role groups of :mod:`campaigns.roles`, in one step instead of
three admin pages.

The password: ``--password``; else asked for twice on a terminal (an empty answer: generated);
else generated. A generated password is printed once, as the last line of output; only its hash is
stored. A given or typed one must pass the project's password validators (``AUTH_PASSWORD_VALIDATORS``).
"""

from __future__ import annotations

import getpass
import secrets
import sys

from django.contrib.auth import password_validation
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import validate_email
from django.db import transaction

from campaigns import roles


class Command(BaseCommand):
    help = "Create a staff user in one or more role groups (marketing, product, support)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", action="append", required=True, choices=sorted(roles.GROUP_PERMISSIONS),
                            help="A staff role (its group's permissions: docs/OPERATIONS.md); repeat for several.")
        parser.add_argument("--email", default="")
        parser.add_argument("--password", default=None,
                            help="Default: asked for on a terminal, else generated and printed once.")

    def handle(self, *args, username, role, email, password, **options):
        if User.objects.filter(username=username).exists():
            raise CommandError(f"user {username!r} already exists: change its groups in the admin")
        if email:
            try:
                validate_email(email)
            except ValidationError:
                raise CommandError(f"--email {email!r} is not an email address") from None
        wanted = list(dict.fromkeys(role))
        groups = list(Group.objects.filter(name__in=wanted))
        if len(groups) != len(wanted):
            missing = sorted(set(wanted) - {g.name for g in groups})
            raise CommandError(f"group {', '.join(missing)} does not exist: run `manage.py migrate` first")
        if password is None and sys.stdin.isatty():
            password = self._ask()
        generated = not password
        if generated:
            password = secrets.token_urlsafe(18)
        user = User(username=username, email=email, is_staff=True)
        try:
            password_validation.validate_password(password, user)
        except ValidationError as exc:
            raise CommandError("password: " + " ".join(exc.messages)) from None
        user.set_password(password)
        with transaction.atomic():
            user.save()
            user.groups.set(groups)
        self.stdout.write(f"Created staff user {username!r} (role {', '.join(wanted)}).")
        if generated:
            self.stdout.write("Its password, shown only now:")
            self.stdout.write(password)

    def _ask(self) -> str:
        first = getpass.getpass("Password (empty: generate one): ")
        if first and getpass.getpass("Password (again): ") != first:
            raise CommandError("the two passwords differ")
        return first
