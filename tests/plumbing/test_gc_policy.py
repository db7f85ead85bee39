"""settle_long_lived_heap: what is loaded is out of the collector's walks, and young collections are rarer;
FreezeSurvivors: what survived a full collection is out of the next ones' walks, until a reclaim."""

import gc
import weakref

from prometheus_client import CollectorRegistry, generate_latest

from gpuaware.plumbing.gc_policy import (
    PYTHON_DEFAULT_THRESHOLD,
    YOUNG_THRESHOLD,
    FreezeSurvivors,
    fresh_process_gc,
    hold_collections,
    settle_long_lived_heap,
)


def test_the_loaded_heap_is_frozen_and_the_young_generation_collected_less_often():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # CPython's defaults (a bench run in this process may have tuned them)
    try:
        gc.unfreeze()
        hold_collections()  # while the process loads, nothing walks the growing heap
        assert not gc.isenabled()
        kept = [[i] for i in range(1000)]  # lists: objects the collector tracks
        settle_long_lived_heap()
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 20, 10)
        a, b = [], []
        a.append(b)
        b.append(a)  # a cycle made afterwards is still collected
        del a, b
        assert gc.collect() >= 2
    finally:
        gc.enable()
        gc.unfreeze()
        gc.set_threshold(*before)


def test_fresh_process_gc_undoes_the_settling_and_frees_what_the_last_one_froze():
    import weakref

    class Finished:  # a scheduler that ran: garbage in a cycle, frozen with the heap it settled
        pass

    before = gc.get_threshold()
    try:
        done = Finished()
        done.me = done
        gone = weakref.ref(done)
        hold_collections()
        settle_long_lived_heap()
        del done
        gc.collect()
        assert gone() is not None and gc.get_freeze_count() > 0  # frozen: no collection frees it
        fresh_process_gc()
        assert gone() is None
        assert gc.get_freeze_count() == 0 and gc.isenabled()
        assert gc.get_threshold() == PYTHON_DEFAULT_THRESHOLD
    finally:
        gc.enable()
        gc.unfreeze()
        gc.set_threshold(*before)


class _Cyclic:
    pass


def test_full_collections_freeze_their_survivors_and_a_reclaim_frees_cycles_dropped_meanwhile():
    before = gc.get_threshold()
    now = [0.0]
    survivors = FreezeSurvivors(reclaim_every_s=60.0, clock=lambda: now[0]).install()
    try:
        gc.unfreeze()
        assert gc.get_threshold() == before
        tracker = _Cyclic()
        tracker.me = tracker  # long-lived, in a cycle
        gone = weakref.ref(tracker)
        kept = [[i] for i in range(1000)]
        gc.collect()
        assert survivors.frozen >= 1 and gc.get_freeze_count() >= len(kept) + 1
        # A later full collection walks only what came since: the frozen cycle, dropped now, stays ...
        del tracker
        gc.collect()
        assert gone() is not None and survivors.frozen >= 2
        survivors.reclaim()  # ... until a reclaim (a rebalance let the trackers go): the next walk frees it
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert gone() is None
        # And at the latest every reclaim_every_s: the full collection due then unfreezes instead of freezing.
        late = _Cyclic()
        late.me = late
        late_gone = weakref.ref(late)
        gc.collect()
        del late
        now[0] = 61.0
        gc.collect()  # the reclaim: unfrozen, not frozen again
        assert survivors.reclaims == 2 and gc.get_freeze_count() == 0
        gc.collect()
        assert late_gone() is None
    finally:
        survivors.uninstall()
        gc.set_threshold(*before)
    assert survivors._on_collection not in gc.callbacks and gc.get_freeze_count() == 0


def test_the_policy_shows_what_it_froze_and_how_often_it_reclaimed():
    survivors = FreezeSurvivors().install()
    try:
        kept = [[i] for i in range(1000)]
        gc.collect()
        survivors.reclaim()
        registry = CollectorRegistry()
        registry.register(survivors)
        text = generate_latest(registry).decode()
        assert survivors.frozen >= 1 and f"gpuaware_gc_freezes_total {float(survivors.frozen)}" in text
        assert "gpuaware_gc_reclaims_total 1.0" in text
        assert "gpuaware_gc_frozen_objects 0.0" in text and kept  # counted after the reclaim's unfreeze
    finally:
        survivors.uninstall()


def test_a_collection_that_began_before_a_reclaim_does_not_freeze_after_it():
    # Another thread's full collection, switched out between its end and its callback while the event loop
    # reclaimed, froze the whole heap nobody had walked: the reclaim was lost for ten minutes (review).
    survivors = FreezeSurvivors()
    try:
        gc.unfreeze()
        kept = [[i] for i in range(1000)]
        survivors._on_collection("start", {"generation": 2})
        survivors.reclaim()
        survivors._on_collection("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
        assert gc.get_freeze_count() == 0 and survivors.frozen == 0 and kept
        survivors._on_collection("start", {"generation": 2})  # the next one, after the reclaim, freezes
        survivors._on_collection("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
        assert gc.get_freeze_count() >= len(kept) and survivors.frozen == 1
    finally:
        survivors.uninstall()


def test_scrapes_count_the_frozen_objects_at_most_every_five_minutes(monkeypatch):
    """A count walks the frozen list (tens of millions of objects at fleet size): scrapes in between show the last
    count, and a reclaim's zero is known without one."""
    import gpuaware.plumbing.gc_policy as policy

    now = [1000.0]
    counts = []
    monkeypatch.setattr(policy.gc, "get_freeze_count", lambda: counts.append(now[0]) or 42)
    survivors = FreezeSurvivors(clock=lambda: now[0])
    registry = CollectorRegistry()
    registry.register(survivors)
    for _ in range(10):
        assert "gpuaware_gc_frozen_objects 42.0" in generate_latest(registry).decode()
        now[0] += 29.0
    assert counts == [1000.0]
    now[0] = 1000.0 + policy.COUNT_EVERY_S
    generate_latest(registry)
    assert counts == [1000.0, 1000.0 + policy.COUNT_EVERY_S]
    monkeypatch.setattr(policy.gc, "unfreeze", lambda: None)
    survivors.reclaim()
    assert "gpuaware_gc_frozen_objects 0.0" in generate_latest(registry).decode() and len(counts) == 2


def test_the_first_freeze_after_a_reclaim_is_counted_at_the_next_scrape(monkeypatch):
    """A reclaim's zero stands only until the heap is frozen again, not for the five minutes between counts."""
    import gpuaware.plumbing.gc_policy as policy

    now = [1000.0]
    monkeypatch.setattr(policy.gc, "get_freeze_count", lambda: 42)
    monkeypatch.setattr(policy.gc, "unfreeze", lambda: None)
    monkeypatch.setattr(policy.gc, "freeze", lambda: None)
    survivors = FreezeSurvivors(clock=lambda: now[0])
    registry = CollectorRegistry()
    registry.register(survivors)
    survivors.reclaim()
    assert "gpuaware_gc_frozen_objects 0.0" in generate_latest(registry).decode()
    survivors._on_collection("start", {"generation": 2})
    survivors._on_collection("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
    now[0] += 5.0
    assert "gpuaware_gc_frozen_objects 42.0" in generate_latest(registry).decode()
