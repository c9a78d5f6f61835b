"""The services' heap upkeep (`gpuorch.runtime.heap`): survivors frozen, cycles still found."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from gpuorch.resync import Resync
from gpuorch.runtime import heap


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of this worker's tests run with a heap as usual


class Node:
    me: Node | None = None


def cycle() -> weakref.ref[Node]:
    n = Node()
    n.me = n  # garbage only the cyclic collector can free
    return weakref.ref(n)


def test_what_survives_a_round_is_left_out_of_later_passes() -> None:
    kept = Node()
    heap.freeze_young()
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())  # frozen: no generation holds it
    assert kept.me is None  # still an ordinary object


def test_garbage_among_the_young_goes_before_the_freeze() -> None:
    ref = cycle()
    heap.freeze_young()
    assert ref() is None


def test_a_cycle_dropped_after_the_freeze_is_found_by_the_full_collection_only() -> None:
    n = Node()
    n.me = n
    ref = weakref.ref(n)
    heap.freeze_young()  # still referenced: frozen
    del n
    gc.collect()  # an ordinary full pass leaves frozen objects alone
    assert ref() is not None
    heap.collect_all()
    assert ref() is None
    assert gc.get_freeze_count() > 0, "what is left is frozen again"


def test_rounds_are_young_ones_with_a_full_collection_every_so_often() -> None:
    pacing = Resync(every=3, share=0.0)  # (the pacing by cost is tests/runtime/test_resync.py's)
    kinds = [heap.round_once(pacing, float(t)) for t in range(7)]
    assert kinds == ["full", "young", "young", "full", "young", "young", "full"]
