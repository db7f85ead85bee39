"""TokenBucket: client-go's client-side rate limit, for blocking callers and the event loop alike."""

from __future__ import annotations

import pytest

from gpuaware.plumbing.kube.ratelimit import TokenBucket


def test_the_burst_is_there_at_once_then_one_token_per_one_over_qps():
    now, waits = [0.0], []

    def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    bucket = TokenBucket(qps=50.0, burst=5, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        bucket.take()
    assert waits == []
    for _ in range(5):
        bucket.take()
    assert waits == pytest.approx([1 / 50] * 5)


def test_reservations_wait_in_the_order_they_were_made_and_saved_tokens_refill():
    now = [0.0]
    bucket = TokenBucket(qps=10.0, burst=2, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(5)] == pytest.approx([0.0, 0.0, 0.1, 0.2, 0.3])
    now[0] = 10.0  # long idle: back to the burst, never more
    assert [bucket.reserve() for _ in range(3)] == pytest.approx([0.0, 0.0, 0.1])


@pytest.mark.parametrize(("qps", "burst"), [(0.0, 5), (-1.0, 5), (10.0, 0)])
def test_a_bucket_that_could_never_grant_is_refused(qps, burst):
    with pytest.raises(ValueError, match="qps > 0 and burst >= 1"):
        TokenBucket(qps, burst)
