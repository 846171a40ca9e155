"""No import cycle inside any app (docs/ARCHITECTURE.md §3): a module that imports one that imports
it back, however far round, cannot be placed in a layer. grimp (what lint-imports reads) sees every
import statement, function-level ones included; the stdlib's topological sort names the cycle."""

from __future__ import annotations

from graphlib import CycleError, TopologicalSorter

import grimp
import pytest

APPS = ["core", "providers", "preferences", "notifications", "campaigns", "config"]


def first_cycle(*packages: str) -> list[str]:
    """One import cycle among the modules of ``packages`` (``[a, b, …, a]``), or ``[]``."""
    graph = grimp.build_graph(*packages)
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    try:
        TopologicalSorter(imports).prepare()
    except CycleError as cycle:
        return list(reversed(cycle.args[1]))
    return []


@pytest.mark.parametrize("app", APPS)
def test_no_import_cycle_inside_an_app(app):
    assert first_cycle(app) == []
