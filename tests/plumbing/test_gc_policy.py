"""settle_long_lived_heap: what is loaded is out of the collector's walks, and young collections are rarer."""

import gc

from plumbing.gc_policy import (
    PYTHON_DEFAULT_THRESHOLD,
    YOUNG_THRESHOLD,
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
