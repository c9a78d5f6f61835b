"""A follower keeps each workload's trace context small (`pack_traceparent`: a W3C `traceparent`
as its 26 bytes) and gives back exactly what the event carried, before and after a snapshot."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuorch.follow import Follower
from gpuorch.projection import Projection
from gpuorch.runtime.snapshot import decode_body, follower_body
from gpuorch.runtime.telemetry import carrier_of, pack_traceparent, unpack_traceparent


def _w3c(n: int) -> st.SearchStrategy[str]:
    return st.text("0123456789abcdef", min_size=n, max_size=n)


_traceparents = st.builds(lambda v, t, s, f: f"{v}-{t}-{s}-{f}", _w3c(2), _w3c(32), _w3c(16), _w3c(2))


@given(tp=_traceparents)
def test_a_w3c_traceparent_is_kept_as_its_26_bytes_and_read_back_the_same(tp: str) -> None:
    kept = pack_traceparent(tp)
    assert isinstance(kept, bytes) and len(kept) == 26
    assert unpack_traceparent(kept) == tp and carrier_of(kept) == {"traceparent": tp}


@given(tp=st.one_of(st.text(max_size=60), _traceparents.map(str.upper), _traceparents.map(lambda t: t + "-00")))
def test_any_other_traceparent_is_kept_as_its_string(tp: str) -> None:
    kept = pack_traceparent(tp)
    assert unpack_traceparent(kept) == tp
    if isinstance(kept, bytes):  # (only the lowercase W3C form packs: uppercase hex would come back lowercase)
        assert tp == tp.lower() and len(tp) == 55


def test_a_follower_gives_back_the_trace_context_it_was_given_and_its_snapshot_has_the_carriers() -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    f = Follower(Projection(compact=True))
    f.remember("w1", {"traceparent": tp})
    f.remember("w2", {"traceparent": "00-ODD", "other": "x"})
    f.remember("w3", {"traceparent": tp, "tracestate": "vendor=1"})
    assert isinstance(f.traceparents["w1"], bytes)
    assert [f.traceparent(w) for w in ("w1", "w2", "w3")] == [tp, "00-ODD", tp]
    assert f.context("w1") is not None
    body = decode_body(follower_body(f.projection, f.traceparents))
    assert body.traceparents == {"w1": {"traceparent": tp}, "w2": {"traceparent": "00-ODD"}, "w3": {"traceparent": tp, "tracestate": "vendor=1"}}
    g = Follower(Projection(compact=True))
    g.restore(f.projection, body.traceparents)
    assert g.traceparents == f.traceparents
