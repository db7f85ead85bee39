"""numpy's default_rng draws, reproduced without numpy: draw for draw against numpy itself."""

from __future__ import annotations

import numpy as np
import pytest

from gpuaware.agent.rng import Pcg64


@pytest.mark.parametrize("seed", [0, 1, 7, 2**32 - 1, 2**32, 2**70 + 12345])
def test_integers_and_random_match_numpy_draw_for_draw(seed):
    ref, ours = np.random.default_rng(seed), Pcg64(seed)
    for high in (4, 1, 3, 1000, 110_000, 2**31 + 5, 2**32):
        assert [int(ref.integers(0, high)) for _ in range(50)] == [ours.integers(0, high) for _ in range(50)]
        assert float(ref.random()) == ours.random()  # interleaved: a 64-bit draw after an odd 32-bit count
    assert [int(ref.integers(17)) for _ in range(20)] == [ours.integers(17) for _ in range(20)]


def test_array_draws_are_the_same_stream_as_scalar_ones():
    ref, ours = np.random.default_rng(3), Pcg64(3)
    assert ref.integers(0, 4, size=(10, 127)).ravel().tolist() == [ours.integers(0, 4) for _ in range(1270)]
    assert ref.random((10, 4)).ravel().tolist() == [ours.random() for _ in range(40)]


@pytest.mark.parametrize(("call", "message"), [
    (lambda r: r.integers(5, 5), "high 5 must be above low 5"),
    (lambda r: r.integers(0, 2**33), "above 2\\*\\*32"),
])
def test_out_of_range_bounds_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call(Pcg64(0))


def test_a_negative_seed_is_refused():
    with pytest.raises(ValueError, match="seed: -1 is negative"):
        Pcg64(-1)
