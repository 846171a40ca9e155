"""The docs stay true to the code and to themselves: every environment variable the settings read has
a row in docs/OPERATIONS.md "Configuration", every relative link in README/docs/ resolves (file and
``#anchor``), and every ``X.md §N`` cited in code or docs names an existing numbered section of X.
Pure file reads: no database, no Django settings import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: Modules that read the environment for the platform's configuration (config/test_settings.py's
#: variables are the test session's: docs/TESTING.md).
SETTINGS_MODULES = ("config/settings.py", "config/provider_settings.py", "config/gunicorn_conf.py",
                    "config/gunicorn_worker.py")
#: Call forms that read one variable by name: ``env("X")``, ``env.int("X")``, ``os.environ.get("X")``,
#: provider_settings' ``get("X")`` / ``has("X")``.
_READERS = re.compile(r"^(env(\.\w+)?|os\.environ\.get|os\.getenv|environ\.get|get|has)$")
_CODE_DIRS = ("core", "providers", "preferences", "notifications", "campaigns", "config", "bench", "scripts",
              "tests")


def env_variables(source: str) -> set[str]:
    """The variable names ``source`` reads (string-literal first argument of a reader call), plus the
    upper-case string values of module-level dicts (provider_settings' ``ENV``, ``LIST_VARIABLES``)."""
    tree = ast.parse(source)
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str) and _READERS.match(ast.unparse(node.func))):
            names.add(node.args[0].value)
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for value in _dict_values(node.value):
                if isinstance(value, ast.Constant) and isinstance(value.value, str) \
                        and re.fullmatch(r"[A-Z][A-Z0-9]*_[A-Z0-9_]+", value.value):
                    names.add(value.value)
    return names


def _dict_values(node: ast.Dict) -> list[ast.expr]:
    values = []
    for value in node.values:
        values += _dict_values(value) if isinstance(value, ast.Dict) else [value]
    return values


def configuration_table() -> set[str]:
    """Every `VARIABLE` named in the first column of OPERATIONS.md's "Configuration" table."""
    section = (DOCS / "OPERATIONS.md").read_text().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for cell in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", cell)}


def test_env_variables_finds_every_reader_form():
    source = ('import os\nenv = None\nA = env("ONE")\nB = env.int("TWO", default=1)\n'
              'C = os.environ.get("THREE")\nD = {"x": {"Y": "FOUR_FIVE"}}\nE = env("lower_ok")\n')
    assert env_variables(source) == {"ONE", "TWO", "THREE", "FOUR_FIVE", "lower_ok"}


def test_every_setting_variable_has_a_row_in_operations():
    read = set().union(*(env_variables((ROOT / path).read_text()) for path in SETTINGS_MODULES))
    assert len(read) > 80  # the parser still finds the settings' variables
    missing = sorted(read - configuration_table())
    assert missing == [], f"read by config/, no row in docs/OPERATIONS.md Configuration: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation except ``-``/``_`` dropped, spaces → ``-``."""
    text = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: p.name)
def test_relative_links_resolve(path):
    broken = []
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            broken.append(target)
    assert broken == []


#: ``ARCHITECTURE.md §6``, ````docs/PROVIDERS.md```` §1, ``[APP.md](APP.md) §2``, ``TYPES.md, §3``.
_CITED = re.compile(r"([A-Z][A-Z-]*)\.md`*(?:\]\([^)]*\))?`*,?\s+§(\d+)")


def _sections(name: str) -> set[str]:
    return set(re.findall(r"^## (\d+)\. ", (DOCS / f"{name}.md").read_text(), flags=re.M))


def _citing_files() -> list[Path]:
    files = _markdown_files()
    for folder in _CODE_DIRS:
        files += sorted((ROOT / folder).rglob("*.py"))
    return [path for path in files if path != Path(__file__).resolve()]  # its own examples are wrong


def test_section_references_name_existing_sections():
    wrong = []
    for path in _citing_files():
        text = path.read_text()
        for name, number in _CITED.findall(text):
            if not (DOCS / f"{name}.md").exists() or number not in _sections(name):
                wrong.append(f"{path.relative_to(ROOT)}: {name}.md §{number}")
        if path.parent == DOCS:  # a bare §N in a doc is its own section, unless an RFC's or another file's
            for match in re.finditer(r"§(\d+)", text):
                before = text[max(0, match.start() - 40):match.start()]
                if not re.search(r"\.md`*(\]\([^)]*\))?`*,?\s*(\S+, )?$|RFC|TS #", before) \
                        and match.group(1) not in _sections(path.stem):
                    wrong.append(f"{path.relative_to(ROOT)}: §{match.group(1)}")
    assert wrong == []


def test_section_reference_check_catches_a_wrong_number():
    assert _CITED.findall("see docs/ARCHITECTURE.md §99 and ``docs/PROVIDERS.md`` §1(d)") == [
        ("ARCHITECTURE", "99"), ("PROVIDERS", "1")]
    assert "99" not in _sections("ARCHITECTURE") and "1" in _sections("PROVIDERS")
