"""Hypothesis strategies for every contract type, derived from `msgspec.inspect`.

`hypothesis.strategies.from_type` only fills a Struct's required fields and produces NaN and
infinite floats that JSON cannot carry, so the strategies are built from msgspec's own view of
each type instead: every field (required or defaulted, sometimes omitted), every nested Struct,
tagged unions, literals. A field of a kind not handled here fails loudly, so a new field type
cannot silently go untested.
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=12)

_cache: dict[type, st.SearchStrategy[Any]] = {}


def for_type(tp: Any) -> st.SearchStrategy[Any]:
    """A strategy for any type msgspec understands (a Struct class, a Union, ...)."""
    return _for_info(mi.type_info(tp))


def _for_info(t: mi.Type) -> st.SearchStrategy[Any]:
    if isinstance(t, mi.StructType):
        return _struct(t)
    if isinstance(t, mi.UnionType):
        return st.one_of([_for_info(x) for x in t.types])
    if isinstance(t, mi.IntType):
        lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else -(2**63))
        hi = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else 2**63 - 1)
        return st.integers(min_value=lo, max_value=hi)
    if isinstance(t, mi.FloatType):
        return st.floats(
            min_value=t.ge if t.ge is not None else t.gt,
            max_value=t.le if t.le is not None else t.lt,
            exclude_min=t.gt is not None,
            exclude_max=t.lt is not None,
            allow_nan=False,
            allow_infinity=False,
        )
    if isinstance(t, mi.StrType):
        return st.text(min_size=t.min_length or 0, max_size=max(t.min_length or 0, 12))
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.ListType):
        return st.lists(_for_info(t.item_type), max_size=3)
    if isinstance(t, (mi.VarTupleType,)):
        return st.lists(_for_info(t.item_type), max_size=3).map(tuple)
    if isinstance(t, mi.DictType):
        return st.dictionaries(_for_info(t.key_type), _for_info(t.value_type), max_size=3)
    raise NotImplementedError(f"no strategy for msgspec type {t!r}: extend tests/proto/strategies.py")


def _struct(t: mi.StructType) -> st.SearchStrategy[Any]:
    cls = t.cls
    if cls not in _cache:
        required = {f.name: _for_info(f.type) for f in t.fields if f.required}
        optional = {f.name: _for_info(f.type) for f in t.fields if not f.required}
        _cache[cls] = st.fixed_dictionaries(required, optional=optional).map(lambda kw: cls(**kw))
    return _cache[cls]


def extra_field_values() -> st.SearchStrategy[Any]:
    """JSON-able values a future release might put in a new field."""
    scalars = st.none() | st.booleans() | INT64 | FLOATS | TEXT
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
        max_leaves=6,
    )


def to_builtins(obj: msgspec.Struct) -> Any:
    return msgspec.to_builtins(obj)
