"""settle_long_lived_heap: what is loaded is out of the collector's walks, and young collections are rarer."""

import gc

from plumbing.gc_policy import YOUNG_THRESHOLD, settle_long_lived_heap


def test_the_loaded_heap_is_frozen_and_the_young_generation_collected_less_often():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # CPython's defaults (a bench run in this process may have tuned them)
    try:
        kept = [{"pod": i} for i in range(1000)]
        settle_long_lived_heap()
        assert gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 20, 10)
        a, b = [], []
        a.append(b)
        b.append(a)  # a cycle made afterwards is still collected
        del a, b
        assert gc.collect() >= 2
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
