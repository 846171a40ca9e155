"""Querysets compiled to SQL once per thread and run again with new parameter values.

Django compiles a queryset's SQL afresh on every evaluation; for a statement run per batch of one
(the high tier's load stage) the compile was ~28 % of the task (docs/PERFORMANCE.md, "What an OTP
costs"). :class:`Compiled` builds the queryset once from *sentinel* parameters, keeps the SQL text
with its placeholders and Django's description of the rows, and then runs the SQL with a cursor:
the rows come back as the model instances (``Model.from_db``, ``select_related`` objects attached)
or the tuples the queryset would give, never a row type of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators

M = TypeVar("M", bound=Model)


class Compiled(Generic[M]):
    """``build(*sentinels)`` → a queryset whose parameters are the given sentinels (each of
    ``params`` names one). Run with :meth:`models` (a model queryset, ``select_related`` allowed, no
    annotations) or :meth:`tuples` (a ``values_list`` queryset). Each parameter is used as given:
    a varying list goes in as one array (``RawSQL("SELECT unnest(%s::uuid[])", …)``), so the SQL
    never depends on its length. Compiled on first use per thread (Django's connections are per
    thread)."""

    def __init__(self, build: Callable[..., QuerySet[M, Any]], params: tuple[str, ...] = ()) -> None:
        self._build = build
        self._names = params
        self._local = threading.local()

    def _compiled(self) -> _State:
        state = getattr(self._local, "state", None)
        if state is None:
            sentinels = [f"\x00compiled:{name}\x00" for name in self._names]
            queryset = self._build(*sentinels)
            compiler = queryset.query.get_compiler(using=queryset.db)
            sql, params = compiler.as_sql()  # also fills compiler.select and klass_info
            slots = [sentinels.index(p) if p in sentinels else None for p in params]
            if sorted(s for s in slots if s is not None) != list(range(len(sentinels))):
                raise ValueError(f"each parameter must appear once in the compiled SQL: {sql}")
            state = self._local.state = _State(compiler, sql, list(zip(slots, params, strict=True)), queryset.db)
        return state

    def _rows(self, state: _State, values: tuple) -> Any:
        params = [values[slot] if slot is not None else constant for slot, constant in state.slots]
        with connections[state.db].cursor() as cursor:
            cursor.execute(state.sql, params)
            found = cursor.fetchall()
        return state.compiler.results_iter([found])

    def tuples(self, *values: Any) -> list[tuple]:
        """The rows as tuples of the selected columns (Django's converters applied)."""
        return [tuple(row) for row in self._rows(self._compiled(), values)]

    def models(self, *values: Any) -> list[M]:
        """The rows as model instances, as the queryset's iteration makes them (``ModelIterable``)."""
        state = self._compiled()
        model, init_list, start, end, populators = state.instances()
        made: list[M] = []
        for row in self._rows(state, values):
            obj = model.from_db(state.db, init_list, row[start:end])
            for populator in populators:
                populator.populate(row, obj)
            made.append(obj)
        return made


class _State:
    """One thread's compiled statement: the compiler (its ``select``, ``klass_info``, converters),
    the SQL, per placeholder the index of the value to pass (or ``None`` and the constant)."""

    def __init__(self, compiler: Any, sql: str, slots: list[tuple[int | None, Any]], db: str) -> None:
        self.compiler, self.sql, self.slots, self.db = compiler, sql, slots, db
        self._instances: tuple | None = None

    def instances(self) -> tuple:
        """What ``ModelIterable`` derives from the compiler before its loop, derived once."""
        if self._instances is None:
            select, klass_info = self.compiler.select, self.compiler.klass_info
            start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
            self._instances = (klass_info["model"], [f[0].target.attname for f in select[start:end]], start, end,
                               get_related_populators(klass_info, select, self.db))  # type: ignore[call-arg]  # stubs: Django 6
        return self._instances
