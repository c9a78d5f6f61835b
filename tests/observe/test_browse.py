"""The web view's list query (gpuorch.observe.browse): filters, text, orders and pages over a
synthetic fleet, checked against what the fleet's generator intended (never against the index
itself), and the index kept by updates equal to one built afresh."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from gpuorch.observe import browse
from gpuorch.observe.browse import NONE, Index, Query, QueryError, index_of, parse_query
from gpuorch.projection import Projection
from gpuorch_proto import events as ev
from tests.observe.fleet import Fleet, Truth, fleet
from tests.support.builders import make_workload


@pytest.fixture(scope="module")
def small() -> Fleet:
    return fleet(1200, pipelines=20)


@pytest.fixture(scope="module")
def index(small: Fleet) -> Index:
    return index_of(Projection.of(small.events).workloads.values())


def _all(ix: Index, q: Query) -> list[browse.Row]:
    """Every page of the query, in order."""
    out: list[browse.Row] = []
    first = ix.query(q)
    for n in range(1, first.pages + 1):
        page = ix.query(Query(**{**q.__dict__, "page": n}))
        assert page.total == first.total and page.page == n
        assert len(page.rows) == (q.per if n < first.pages else first.total - q.per * (first.pages - 1))
        out += page.rows
    return out


def _value(x: str | None) -> str:
    return NONE if x is None else x


def test_every_workload_has_its_row(small: Fleet, index: Index) -> None:
    assert len(index) == len(small.truth) == 1200
    for wid, t in small.truth.items():
        r = index.rows[wid]
        assert (r.status, r.owner, r.queue, r.cluster, r.pipeline) == (t.status, t.owner, _value(t.queue), _value(t.cluster), _value(t.pipeline)), wid
        assert r.is_pipeline == (wid in small.pipelines)


FILTERS = {
    "one status": {"status": ["failed"]},
    "status and owner": {"status": ["running"], "owner": ["bob"]},
    "two statuses": {"status": ["completed", "failed"]},
    "no policy queue": {"queue": [NONE]},
    "not placed": {"cluster": [NONE]},
    "one pipeline": {"pipeline": ["p-003"]},
    "three fields": {"cluster": ["alpha"], "queue": ["prod"], "owner": ["carol"]},
    "nothing matches": {"owner": ["mallory"]},
}


def _truth_matches(t: Truth, want: dict[str, list[str]]) -> bool:
    have = {"status": t.status, "owner": t.owner, "queue": _value(t.queue), "cluster": _value(t.cluster), "pipeline": _value(t.pipeline)}
    return all(have[f] in values for f, values in want.items())


@pytest.mark.parametrize("want", FILTERS.values(), ids=FILTERS.keys())
def test_filters_keep_what_the_generator_made_so(small: Fleet, index: Index, want: dict[str, list[str]]) -> None:
    q = parse_query([(f, v) for f, values in want.items() for v in values] + [("per", "37")])
    expected = {wid for wid, t in small.truth.items() if _truth_matches(t, want)}
    got = _all(index, q)
    assert [r.id for r in got if r.id not in expected] == []
    assert {r.id for r in got} == expected and len(got) == len(expected)
    assert index.query(q).of == 1200


def test_text_matches_id_name_stage_and_why_in_any_case(small: Fleet, index: Index) -> None:
    by_id = _all(index, parse_query([("q", "P-00"), ("per", "500")]))
    assert {r.id for r in by_id} == {wid for wid in small.truth if "p-00" in wid}
    why = _all(index, parse_query([("q", "Permanent exit"), ("status", "failed"), ("per", "500")]))
    assert {r.id for r in why} == {wid for wid, t in small.truth.items() if t.status == "failed"} != set()
    stage = _all(index, parse_query([("q", "export"), ("per", "500")]))
    assert {r.id for r in stage} == {wid for wid, t in small.truth.items() if t.stage == "export"}


ORDERS = [(k, d) for k in browse.SORT_KEYS for d in (False, True)]


@pytest.mark.parametrize(("key", "descending"), ORDERS, ids=[f"{'-' if d else ''}{k}" for k, d in ORDERS])
@pytest.mark.parametrize("want", [{}, {"status": ["completed"]}, {"pipeline": ["p-001", "p-002"]}],
                         ids=["everything (a slice)", "many (a walk)", "few (sorted)"])  # fmt: skip
def test_every_order_every_page(small: Fleet, index: Index, key: str, descending: bool, want: dict[str, list[str]]) -> None:
    q = Query(**{f: frozenset(v) for f, v in want.items()}, sort=key, descending=descending, per=41)
    rows = [index.rows[wid] for wid, t in small.truth.items() if _truth_matches(t, want)]
    expected = sorted(rows, key=lambda r: (getattr(r, key), r.id), reverse=descending)
    assert [r.id for r in _all(index, q)] == [r.id for r in expected]


def test_newest_first_by_default(small: Fleet, index: Index) -> None:
    page = index.query(parse_query([]))
    newest = sorted(small.truth, key=lambda w: small.truth[w].submitted, reverse=True)[:browse.PER_PAGE]
    assert [r.id for r in page.rows] == newest
    assert (page.first, page.last, page.pages) == (1, browse.PER_PAGE, 1200 // browse.PER_PAGE)


def test_a_page_past_the_end_shows_the_last_and_nothing_is_one_empty_page(index: Index) -> None:
    last = index.query(parse_query([("status", "failed"), ("page", "9999")]))
    assert last.page == last.pages and 0 < len(last.rows) <= browse.PER_PAGE
    assert last.last == last.total
    none = index.query(parse_query([("owner", "mallory")]))
    assert (none.total, none.page, none.pages, none.rows, none.first) == (0, 1, 1, [], 0)


def test_an_index_kept_by_updates_equals_one_built_afresh(small: Fleet) -> None:
    p = Projection()
    kept = Index()
    for n, (seq, e) in enumerate(small.events, 1):
        p.apply(e, seq)
        touched = [e.workload_id, *(c.workload_id for c in e.children)] if isinstance(e, ev.PipelineExpanded) else [e.workload_id]
        for wid in touched:
            v = p.get(wid)
            assert v is not None
            kept.update(v)
        if n % 997 == 0 or n == len(small.events):
            fresh = index_of(p.workloads.values())
            assert kept.rows == fresh.rows
            assert {f: {k: s for k, s in d.items()} for f, d in kept.by.items()} == fresh.by
            assert kept.order == fresh.order


def test_a_status_change_moves_the_row() -> None:
    f = Fleet()
    f.add(ev.Submitted(workload_id="w1", at=1.0, workload=make_workload(name="w1")))
    f.run("w1", 1.0, "running", "beta")
    p = Projection.of(f.events)
    ix = index_of(p.workloads.values())
    running = parse_query([("status", "running")])
    assert [r.id for r in ix.query(running).rows] == ["w1"]
    v = p.apply(ev.Failed(workload_id="w1", attempt_id="w1-a1", epoch=1, cluster="beta", at=20.0, exit_code=2, reason="oom"), 100)
    assert v is not None
    v = p.apply(ev.WorkloadFailed(workload_id="w1", at=21.0, reason="permanent exit code 2"), 101)
    assert v is not None
    ix.update(v)
    assert ix.query(running).total == 0 and "running" not in ix.by["status"]
    assert [r.id for r in ix.query(parse_query([("status", "failed")])).rows] == ["w1"]
    assert ix.order["status"] == [("failed", "w1")]
    assert dict(ix.facets()["status"]) == {"failed": 1}


BAD = {
    "unknown parameter": ([("colour", "red")], "colour"),
    "unknown sort": ([("sort", "-gpus")], "sort"),
    "page not a number": ([("page", "two")], "page"),
    "page zero": ([("page", "0")], "page"),
    "too many per page": ([("per", "5000")], "per"),
    "text too long": ([("q", "x" * 201)], "q"),
    "sort twice": ([("sort", "id"), ("sort", "owner")], "sort"),
}


@pytest.mark.parametrize(("params", "param"), BAD.values(), ids=BAD.keys())
def test_a_bad_parameter_is_named(params: list[tuple[str, str]], param: str) -> None:
    with pytest.raises(QueryError) as err:
        parse_query(params)
    assert err.value.param == param and str(err.value).startswith(f"{param}: ")


def test_links_keep_the_query() -> None:
    q = parse_query([("status", "failed"), ("status", "lost"), ("owner", "bob"), ("q", "oom"), ("sort", "owner"), ("page", "3"),
                     ("per", "100"), ("queue", "")])  # fmt: skip
    assert q.queue == frozenset() and q.sort == "owner" and not q.descending
    assert parse_query(parse_qsl(q.params())) == q
    again = parse_query(parse_qsl(q.sorted_by("owner")))
    assert (again.sort, again.descending, again.page, again.status) == ("owner", True, 1, q.status)
    other = parse_query(parse_qsl(q.sorted_by("submitted")))
    assert (other.sort, other.descending) == ("submitted", True)
    assert parse_query([]).params() == ""
