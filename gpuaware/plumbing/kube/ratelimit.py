"""client-go's client-side rate limit (``flowcontrol.NewTokenBucketRateLimiter``): ``qps`` tokens a second, up to
``burst`` saved, one per request.

``reserve()`` takes a token now and says how long its request must wait (client-go's ``Reserve``), so one
bucket serves blocking callers (``take()``) and the event loop (``await asyncio.sleep(bucket.reserve())``);
reservations are granted in the order they are made.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if qps <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs qps > 0 and burst >= 1 (got qps={qps}, burst={burst})")
        self.qps, self.burst = qps, burst
        self._clock, self._sleep = clock, sleep
        self._tokens, self._at = float(burst), clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take a token; the seconds to wait before using it (0 while saved tokens last)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1
            return -self._tokens / self.qps if self._tokens < 0 else 0.0

    def take(self) -> None:
        """Take a token, blocking the calling thread until it may be used."""
        wait = self.reserve()
        if wait > 0:
            self._sleep(wait)
