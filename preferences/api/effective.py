"""The effective preference matrix of ``GET /v1/users/{user_id}/preferences``: for every notification
type and each of its channels, may it reach this recipient, and why not (docs/TYPES.md).

Types live a floor above, so the notifications app registers the function that builds the matrix
with :func:`register_matrix` at startup (``notifications.events.matrix.effective_matrix``); with
none registered the matrix is ``[]``. An entry (:class:`~preferences.api.serializers.
EffectiveEntrySerializer`) says ``allowed`` with the reason code of
:func:`preferences.suppression.suppression_reason`, or :data:`REQUIRED` when an opt-out does not
apply to a ``required`` type. The entry's fields: docs/API.md, "Preferences".
"""

from __future__ import annotations

from collections.abc import Callable

from preferences.models import Recipient

#: The reason of an allowed entry whose opt-out the type's ``required`` flag overrides.
REQUIRED = "required"

#: A matrix builder: ``recipient -> [entry…]``, sorted by type key, then the type's channel order;
#: it reads the recipient's stored preferences, devices and SMS STOPs itself (after a write: as written).
MatrixBuilder = Callable[[Recipient], list[dict]]
_builder: list[MatrixBuilder] = []


def register_matrix(builder: MatrixBuilder) -> None:
    """Make ``builder`` the one source of the effective matrix (registering it again changes nothing;
    a later builder replaces an earlier one); called from the ``AppConfig.ready`` of the app that
    knows the notification types."""
    _builder[:] = [builder]


def effective_matrix(recipient: Recipient) -> list[dict]:
    """The recipient's effective matrix from the registered builder, or ``[]`` when none is."""
    return _builder[0](recipient) if _builder else []
