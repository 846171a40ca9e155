"""Only notifications/lifecycle/ changes a notification's status or reason (docs/ARCHITECTURE.md §5).

Reads the production code (``core``, ``preferences``, ``notifications``, ``campaigns``) and fails on
a write of a notification's ``status``/``reason`` anywhere else: an ORM ``.update(status=…)`` (or
``reason=…``, or ``**fields``) on a Notification queryset (live or history), ``SET status``/``SET reason``
in SQL on ``notifications_notification`` or ``notifications_notificationhistory``, an assignment to
``.status``/``.reason`` of a row; and a move between the two (``DELETE FROM`` the live table, ``INSERT
INTO`` the history: the archiver's). Creating rows is not a transition (INSERTs into the live table and
``create``/``bulk_create`` are not looked at)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "preferences", "notifications", "campaigns")
OWNER = ROOT / "notifications" / "lifecycle"
FIELDS = {"status", "reason"}

#: Models whose own ``status`` these packages may write (not a notification's).
OTHER_MODELS = re.compile(r"^(Campaign|CampaignStatus|Device|DeliveryEvent|Recipient|Preferences|Digest|Event)\b")
_UPDATE_SQL = re.compile(r"UPDATE\s+(?:\{?\w*\}?\s*)?notifications_notification(?:history)?\b.*?\bSET\b"
                         r"(?P<set>.*?)(?:\bFROM\b|\bWHERE\b|$)", re.S | re.I)
#: A row moving between the live table and the history.
_MOVE_SQL = re.compile(r"DELETE\s+FROM\s+notifications_notification\b"
                       r"|INSERT\s+INTO\s+notifications_notificationhistory\b|\{(LIVE|HISTORY)\}", re.I)
_SET_FIELD = re.compile(r"(?<![\w.])(status|reason)\s*=", re.I)


def _dict_names(tree: ast.AST) -> set[str]:
    """Names bound to a dict literal or ``dict(…)`` somewhere in the module (their ``.update`` is a dict's)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict | ast.DictComp):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and "dict" in ast.unparse(
                node.annotation):
            names.add(node.target.id)
    return names


def _root(node: ast.AST) -> str:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def findings(source: str, name: str) -> list[str]:
    """The status/reason writes in one module's ``source`` (``name`` labels them)."""
    tree = ast.parse(source)
    dicts = _dict_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in _UPDATE_SQL.finditer(node.value):
                if _SET_FIELD.search(m.group("set")):
                    found.append(f"{name}:{node.lineno}: SQL sets a notification's status/reason")
            if _MOVE_SQL.search(node.value) and re.search(r"\b(DELETE|INSERT)\b", node.value, re.I):
                found.append(f"{name}:{node.lineno}: SQL moves a notification between live and history")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
            receiver = node.func.value
            keys = {k.arg for k in node.keywords}
            if OTHER_MODELS.match(ast.unparse(receiver)) or _root(receiver) in dicts:
                continue
            if keys & FIELDS or (None in keys and "Notification" in ast.unparse(receiver)):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)[:80]}")
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            if any(isinstance(t, ast.Attribute) and t.attr in FIELDS and _root(t) != "self" for t in flat) \
                    and "CampaignStatus" not in ast.unparse(node.value):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def production_files():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if OWNER in path.parents or "migrations" in path.parts or "tests" in path.parts:
                continue
            yield path


def test_only_the_lifecycle_module_writes_a_notifications_status_or_reason():
    found = [f for path in production_files()
             for f in findings(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == [], "write status/reason through notifications.lifecycle:\n" + "\n".join(found)


def test_the_reader_finds_each_kind_of_write():
    source = '''
SQL = """
UPDATE notifications_notification AS n
   SET status = 'failed', updated_at = %s
 WHERE n.status = 'sent'
"""
REASON_SQL = "UPDATE notifications_notification SET reason = %s WHERE id = %s"
Notification.objects.filter(pk=pk).update(status="cancelled")
qs.filter(status="queued").update(reason="x", updated_at=now)
Notification.objects.filter(pk=pk, status="sent").update(**fields)
n.status = "delivered"
n.status, n.reason = "failed", "x"
OLD = "UPDATE notifications_notificationhistory SET status = 'delivered' WHERE id = %s"
MOVE = "WITH m AS (DELETE FROM notifications_notification WHERE id = %s RETURNING *) INSERT INTO x SELECT * FROM m"
BACK = "INSERT INTO notifications_notificationhistory SELECT * FROM notifications_notification"
NotificationHistory.objects.filter(pk=pk, status="sent").update(**fields)
'''
    assert sorted(int(f.split(":")[1]) for f in findings(source, "m.py")) == [2, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                                                                              16]


def test_the_reader_leaves_other_writes_alone():
    source = '''
READ = "SELECT id FROM notifications_notification WHERE status = 'scheduled'"
LEASE = "UPDATE notifications_notification SET lease_until = %s WHERE status = 'sending'"
Campaign.objects.filter(pk=pk).update(status=CampaignStatus.SENDING)
DeliveryEvent.objects.filter(pk=pk).update(status="delivered")
campaign.status = CampaignStatus.CANCELLED
self.status = status  # an exception's own attribute
fields = {"lease_until": None}
fields.update(reason="", reason_detail="")
Notification.objects.create(status="queued", reason="")
'''
    assert findings(source, "m.py") == []
