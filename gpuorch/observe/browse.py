"""The web view's workload list: filter, sort and page the projection's workloads (pure: no I/O).

`gpuorch web` serves one page of rows at a time, whatever the number of workloads: the browser
never receives the whole list. An `Index` holds one `Row` per workload (what the list shows and
filters on) and is kept up to date one workload at a time, as events arrive (`Index.update`):

- for each filter (`status`, `owner`, `queue`, `cluster`, `pipeline`) the ids per value, so a
  filter is a set intersection (smallest set first) and its counts are set sizes;
- for each sort key (`SORT_KEYS`) the ids in that order, a `SortedList` (sortedcontainers: a
  removal and an insertion in O(log n) when a row's key changes), so no request sorts the whole
  list again.

A query (`Query`, from the URL by `parse_query`) then costs: with no filter, a slice of the order
(O(page)); with filters, the intersection, then either the matching rows sorted (when they are
few) or one walk of the order that keeps the matching ones until the page is full (when they are
many); free text (`q`) is a substring test of each remaining row's `text`. Measured in
docs/web.md (10,000 workloads: well under a millisecond unfiltered, a few with filters).

`NONE` (`-`) is the value of a field a workload has not got (no cluster yet, not in a pipeline,
no policy queue named): `cluster=-` lists what is not placed yet.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlencode

from sortedcontainers import SortedList

from gpuorch.projection import WorkloadView

NONE = "-"
FILTERS = ("status", "owner", "queue", "cluster", "pipeline")
SORT_KEYS = ("submitted", "id", "status", "owner", "queue", "cluster", "pipeline", "attempts")
DEFAULT_SORT = "-submitted"
PER_PAGE = 50
MAX_PER_PAGE = 500
MAX_TEXT = 200
PARAMS = (*FILTERS, "q", "sort", "page", "per")


@dataclass(frozen=True, slots=True)
class Row:
    """One workload as the list shows it (and filters and sorts it)."""

    id: str
    status: str
    owner: str
    queue: str
    cluster: str
    pipeline: str
    stage: str
    attempts: int
    submitted: float
    reason: str
    name: str = ""
    is_pipeline: bool = False  # it has stages (its page draws them)
    text: str = ""  # what free text (`q`) is matched against: id, name, stage and why, lower case

    def as_dict(self) -> dict[str, Any]:
        """As JSON (`/api/workloads`): the fields a workload has not got are null."""
        return {f.name: (None if getattr(self, f.name) == NONE else getattr(self, f.name)) for f in fields(self) if f.name != "text"}


def row_of(v: WorkloadView) -> Row | None:
    """The list's row of a workload; None for an id with no accepted document (a refused message,
    a stage announced by its pipeline but not submitted yet)."""
    wl = v.workload
    if wl is None:
        return None
    a = v.latest_attempt
    cluster = a.cluster if a else (v.decision.cluster if v.decision else None)
    return Row(
        id=v.workload_id, status=v.status, owner=wl.metadata.owner or NONE, queue=wl.spec.policy_queue or NONE,
        cluster=cluster or NONE, pipeline=v.pipeline or NONE, stage=v.stage or "", attempts=len(v.attempts),
        submitted=v.times.get("submitted", 0.0), reason=v.reason, name=wl.metadata.name, is_pipeline=bool(v.children),
        text=f"{v.workload_id}\n{wl.metadata.name}\n{v.stage or ''}\n{v.reason}".lower(),
    )  # fmt: skip


def _key(row: Row, sort: str) -> Any:
    """The row's position in the order by `sort` (ties broken by id, so every order is total)."""
    return (getattr(row, sort), row.id)


class QueryError(ValueError):
    """A query parameter that cannot be used: names it, its value and what would do."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class Query:
    """What the list shows: filters (any of the values, for each field given; all fields given),
    free text, the sort key (`descending`) and the page."""

    status: frozenset[str] = frozenset()
    owner: frozenset[str] = frozenset()
    queue: frozenset[str] = frozenset()
    cluster: frozenset[str] = frozenset()
    pipeline: frozenset[str] = frozenset()
    text: str = ""
    sort: str = "submitted"
    descending: bool = True
    page: int = 1
    per: int = PER_PAGE

    def filters(self) -> dict[str, frozenset[str]]:
        return {f: getattr(self, f) for f in FILTERS if getattr(self, f)}

    @property
    def filtered(self) -> bool:
        return bool(self.filters() or self.text)

    def params(self, **changes: Any) -> str:
        """This query (with `changes`) as a URL query string, defaults left out: the links of the
        list (sort headers, pages) keep every filter."""
        q = replace(self, **changes)
        out: list[tuple[str, str]] = [(f, v) for f in FILTERS for v in sorted(getattr(q, f))]
        if q.text:
            out.append(("q", q.text))
        sort = ("-" if q.descending else "") + q.sort
        if sort != DEFAULT_SORT:
            out.append(("sort", sort))
        if q.page != 1:
            out.append(("page", str(q.page)))
        if q.per != PER_PAGE:
            out.append(("per", str(q.per)))
        return urlencode(out)

    def sorted_by(self, key: str) -> str:
        """The query string of a click on column `key`: that order, or the other way round when
        it is already the order; back to the first page."""
        if key == self.sort:
            return self.params(descending=not self.descending, page=1)
        return self.params(sort=key, descending=key in ("submitted", "attempts"), page=1)


def _int(param: str, raw: str, lo: int, hi: int | None) -> int:
    try:
        n = int(raw)
    except ValueError:
        raise QueryError(param, f"{raw!r} is not a whole number") from None
    if n < lo or (hi is not None and n > hi):
        raise QueryError(param, f"{n} is out of range ({lo}..{hi if hi is not None else ''})")
    return n


def parse_query(params: Iterable[tuple[str, str]]) -> Query:
    """The query of a URL's parameters (a field may repeat: any of its values). Empty values are
    left out (a form's "any"); an unknown parameter or a bad value raises `QueryError`."""
    multi: dict[str, list[str]] = {}
    for k, v in params:
        if k not in PARAMS:
            raise QueryError(k, f"unknown parameter; known: {', '.join(PARAMS)}")
        if v.strip():
            multi.setdefault(k, []).append(v.strip())
    for k in ("q", "sort", "page", "per"):
        if len(multi.get(k, [])) > 1:
            raise QueryError(k, f"given {len(multi[k])} times; give it once")
    one = {k: vs[0] for k, vs in multi.items()}
    text = one.get("q", "")
    if len(text) > MAX_TEXT:
        raise QueryError("q", f"{len(text)} characters; at most {MAX_TEXT}")
    sort = one.get("sort", DEFAULT_SORT)
    key = sort.removeprefix("-")
    if key not in SORT_KEYS:
        raise QueryError("sort", f"{sort!r} is not a column; one of {', '.join(SORT_KEYS)} (a leading '-': descending)")
    return Query(
        **{f: frozenset(multi.get(f, ())) for f in FILTERS}, text=text, sort=key, descending=sort.startswith("-"),
        page=_int("page", one.get("page", "1"), 1, None), per=_int("per", one.get("per", str(PER_PAGE)), 1, MAX_PER_PAGE),
    )  # fmt: skip


@dataclass(frozen=True)
class Page:
    rows: list[Row]
    total: int  # rows that match the query
    page: int  # the page shown (the last one when the query asked past it)
    pages: int
    of: int  # every row
    per: int = PER_PAGE

    @property
    def first(self) -> int:
        """1-based position of the first row shown (0 when none)."""
        return (self.page - 1) * self.per + 1 if self.rows else 0

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1 if self.rows else 0


@dataclass
class Index:
    """The rows, the ids per filter value and the ids in every sort order (see the module doc)."""

    rows: dict[str, Row] = field(default_factory=dict)
    by: dict[str, dict[str, set[str]]] = field(default_factory=lambda: {f: {} for f in FILTERS})
    order: dict[str, SortedList] = field(default_factory=lambda: {k: SortedList() for k in SORT_KEYS})

    def __len__(self) -> int:
        return len(self.rows)

    def update(self, v: WorkloadView) -> None:
        """The workload's row as its view is now (added, moved, or unchanged)."""
        self.put(v.workload_id, row_of(v))

    def put(self, wid: str, new: Row | None) -> None:
        old = self.rows.get(wid)
        if old == new:
            return
        for f in FILTERS:
            was, now = (getattr(old, f) if old else None), (getattr(new, f) if new else None)
            if was == now:
                continue
            if was is not None:
                ids = self.by[f][was]
                ids.discard(wid)
                if not ids:
                    del self.by[f][was]
            if now is not None:
                self.by[f].setdefault(now, set()).add(wid)
        for k in SORT_KEYS:
            if old is not None and new is not None and getattr(old, k) == getattr(new, k):
                continue  # (most events change a row's why, not where it sorts)
            order = self.order[k]
            if old is not None:
                order.remove(_key(old, k))
            if new is not None:
                order.add(_key(new, k))
        if new is None:
            self.rows.pop(wid, None)
        else:
            self.rows[wid] = new

    def facets(self) -> dict[str, list[tuple[str, int]]]:
        """For each filter, its values with how many rows have each (for the filter controls)."""
        return {f: sorted((value, len(ids)) for value, ids in self.by[f].items()) for f in FILTERS}

    def matching(self, q: Query) -> set[str] | None:
        """The ids the query's filters and text keep (None: every row)."""
        sets: list[set[str]] = []
        for f, values in q.filters().items():
            if len(values) == 1:
                sets.append(self.by[f].get(next(iter(values)), set()))
            else:
                sets.append(set().union(*(self.by[f].get(value, set()) for value in values)))
        ids: set[str] | None = None
        if sets:
            sets.sort(key=len)
            ids = set(sets[0]).intersection(*sets[1:]) if len(sets) > 1 else sets[0]
        if q.text:
            t = q.text.lower()
            rows = self.rows
            ids = {i for i in (rows if ids is None else ids) if t in rows[i].text}
        return ids

    def query(self, q: Query) -> Page:
        """The page of rows the query asks for, with the number of rows that match it."""
        ids = self.matching(q)
        order = self.order[q.sort]
        total = len(order) if ids is None else len(ids)
        pages = max(1, math.ceil(total / q.per))
        page = min(q.page, pages)
        start = (page - 1) * q.per
        chosen: Sequence[tuple[Any, str]]
        if ids is None:  # a slice of the order
            if q.descending:
                hi = len(order) - start
                chosen = order[max(0, hi - q.per) : hi][::-1]
            else:
                chosen = order[start : start + q.per]
        elif len(ids) * 16 < len(order):  # few: sort them
            keyed = sorted(((_key(self.rows[i], q.sort), i) for i in ids), reverse=q.descending)
            chosen = [k for k, _ in keyed[start : start + q.per]]
        else:  # many: one walk of the order
            walk = reversed(order) if q.descending else iter(order)
            kept: list[tuple[Any, str]] = []
            skip = start
            for k in walk:
                if k[1] in ids:
                    if skip:
                        skip -= 1
                        continue
                    kept.append(k)
                    if len(kept) == q.per:
                        break
            chosen = kept
        return Page([self.rows[i] for _, i in chosen], total, page, pages, len(self.rows), q.per)


def index_of(views: Iterable[WorkloadView]) -> Index:
    """An index of these views (the web view builds one as the log is replayed)."""
    ix = Index()
    for v in views:
        ix.update(v)
    return ix

