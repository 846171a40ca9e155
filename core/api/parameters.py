"""The rule of every kind of id a path or a query string names, in one place: what it accepts, its
OpenAPI schema (generated from the same rule), and the 422 naming the parameter for a value that
breaks it (:class:`~core.api.errors.InvalidParameter`).

User ids (:func:`core.identifiers.user_id_problem`), push tokens, segment / template slugs
(:data:`SLUG`), categories (:data:`CATEGORY`); notification and campaign UUIDs are matched by the URL.
Ids are taken exactly as given (never trimmed or case-folded) and checked before any query runs
(Postgres text cannot hold NUL). The rules in words: docs/API.md, "Ids and sizes".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from drf_spectacular.utils import OpenApiExample, OpenApiParameter

from core.api.errors import InvalidParameter
from core.identifiers import (
    MAX_PUSH_TOKEN_LENGTH,
    MAX_USER_ID_LENGTH,
    USER_ID_PATTERN,
    control_character_problem,
    no_control_pattern,
    problem_code,
    push_token_problem,
    user_id_problem,
)
from core.vocabulary import CATEGORY_PATTERN, TYPE_KEY_PATTERN


@dataclass(frozen=True)
class IdRule:
    """One kind of id: ``problem(value)`` says why a value breaks the rule (``''``: it does not),
    ``schema`` is its OpenAPI schema, ``description`` the rule in words."""

    problem: Callable[[str], str]
    schema: dict
    description: str
    examples: dict = field(default_factory=dict)

    def check(self, name: str, value: str) -> str:
        """``value`` if it follows the rule. Raises InvalidParameter (422 naming ``name``, code
        ``control_character`` for an invisible character, ``confusable`` for an id mixing scripts,
        else ``invalid``: ``"segment_id: contains a control character (U+0000); 1–64 letters, …"``)."""
        why = self.problem(value)
        if why:
            raise InvalidParameter(name, problem_code(why), f"{why}; {self.description}")
        return value

    def parameter(self, name: str, location: str = OpenApiParameter.PATH, **kwargs) -> OpenApiParameter:
        """The OpenAPI parameter ``name`` following this rule."""
        kwargs.setdefault("examples", [OpenApiExample(k, value=v) for k, v in self.examples.items()] or None)
        kwargs.setdefault("description", self.description[:1].upper() + self.description[1:] + ".")
        return OpenApiParameter(name, dict(self.schema), location, **kwargs)  # type: ignore[arg-type]


def _pattern_problem(pattern: re.Pattern, max_length: int) -> Callable[[str], str]:
    def problem(value: str) -> str:
        if not value:
            return "must not be empty"
        if len(value) > max_length:
            return f"is {len(value)} characters; at most {max_length}"
        return control_character_problem(value) or ("" if pattern.fullmatch(value) else "has a character the "
                                                                                          "rule does not allow")
    return problem


_SLUG_PATTERN = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")

USER_ID = IdRule(user_id_problem, {"type": "string", "pattern": USER_ID_PATTERN},
                 f"the upstream service's user id: 1–{MAX_USER_ID_LENGTH} characters in NFKC without invisible "
                 "characters, whitespace or '/', in one script (case-sensitive, taken as given)", {"user": "alice"})
PUSH_TOKEN = IdRule(push_token_problem, {"type": "string", "pattern": no_control_pattern(MAX_PUSH_TOKEN_LENGTH)},
                    f"a registered push token: 1–{MAX_PUSH_TOKEN_LENGTH} characters without invisible characters",
                    {"token": "fcm-token-1"})
SLUG = IdRule(_pattern_problem(_SLUG_PATTERN, 64), {"type": "string", "pattern": _SLUG_PATTERN.pattern},
              "1–64 letters, digits, '-' and '_' (case-sensitive)")
CATEGORY = IdRule(_pattern_problem(CATEGORY_PATTERN, 64),
                  {"type": "string", "minLength": 1, "maxLength": 64, "pattern": CATEGORY_PATTERN.pattern},
                  "a category: lower-case letters, digits, '_', '.', '-'; at most 64, as on sends")
TYPE_KEY = IdRule(_pattern_problem(TYPE_KEY_PATTERN, 64),
                  {"type": "string", "minLength": 1, "maxLength": 64, "pattern": TYPE_KEY_PATTERN.pattern},
                  "a notification type key: lower-case letters, digits, '_' and '-' (at most 64), starting with "
                  "a letter or digit")
