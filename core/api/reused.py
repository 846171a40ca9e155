"""Request serializers made once per thread and validated again for every request.

DRF builds a serializer's fields per instance by deep-copying the declared ones (and nested
serializers' in turn): ~13 % of a high-priority send's API request (docs/PERFORMANCE.md, "What an
OTP costs"). :func:`validator` keeps one instance per thread and class, its fields built and bound
once, and hands it out with only the request's state reset. Declared fields hold no request state
(they are validated through ``run_validation`` with the value), so a request sees exactly what a
new instance would; the class, and so the OpenAPI schema, is unchanged. Only for serializers made
with ``data`` and no instance, context or ``partial``.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, TypeVar

from rest_framework.serializers import Serializer

S = TypeVar("S", bound=Serializer)

_local = threading.local()
#: What DRF keeps on an instance about the data it was given (``is_valid``, ``errors``, ``data``).
_REQUEST_STATE = ("_validated_data", "_errors", "_data")


def validator(serializer_class: type[S], data: Any) -> S:
    """This thread's instance of ``serializer_class``, holding ``data`` and nothing of an earlier
    request: use it as ``serializer_class(data=data)`` (``is_valid``, ``validated_data``, ``errors``)."""
    made = getattr(_local, "made", None)
    if made is None:
        made = _local.made = {}
    serializer = made.get(serializer_class)
    if serializer is None:
        serializer = made[serializer_class] = serializer_class()
        serializer.fields  # noqa: B018 (built and bound now, once)
    for name in _REQUEST_STATE:
        serializer.__dict__.pop(name, None)
    serializer.initial_data = data
    return serializer


@functools.cache
def field_names(serializer_class: type[Serializer]) -> frozenset[str]:
    """The names of ``serializer_class``'s fields (they are the class's: built once per process)."""
    return frozenset(serializer_class().fields)
