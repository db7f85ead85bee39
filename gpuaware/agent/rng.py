"""numpy's ``default_rng(seed)`` draws that the agent uses, in pure Python, value for value.

The agent seeds its anomaly trees and the simulator's choice of GenTD26 pods from
``numpy.random.default_rng``. Importing numpy costs the agent ~14 MiB of resident memory, a fifth
of its budget (docs/performance.md), for a few hundred draws at start-up; this reproduces the same
stream (SeedSequence -> PCG64 XSL-RR, numpy's ``integers`` Lemire rejection and ``random``'s
53-bit doubles) so the trees and the simulated fleet stay what they were. tests/agent/test_rng.py
checks it draw for draw against numpy.
"""

from __future__ import annotations

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
_M128 = (1 << 128) - 1
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645


def _seed_words(seed: int) -> list[int]:
    """SeedSequence(seed).generate_state(4, uint64): numpy's hash of the seed's 32-bit words."""
    if seed < 0:
        raise ValueError(f"seed: {seed} is negative; numpy's SeedSequence takes non-negative integers")
    entropy = []
    while True:
        entropy.append(seed & _M32)
        seed >>= 32
        if not seed:
            break
    hash_a = [0x43B0D7E5]

    def hashmix(value: int) -> int:
        value ^= hash_a[0]
        hash_a[0] = (hash_a[0] * 0x931E8875) & _M32
        value = (value * hash_a[0]) & _M32
        return value ^ (value >> 16)

    def mix(x: int, y: int) -> int:
        r = (0xCA01F9DD * x - 0x4973F715 * y) & _M32
        return r ^ (r >> 16)

    pool = [hashmix(entropy[i] if i < len(entropy) else 0) for i in range(4)]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(4, len(entropy)):
        for dst in range(4):
            pool[dst] = mix(pool[dst], hashmix(entropy[src]))
    hash_b = 0x8B51F9DD
    words32 = []
    for i in range(8):
        v = pool[i % 4] ^ hash_b
        hash_b = (hash_b * 0x58F38DED) & _M32
        v = (v * hash_b) & _M32
        words32.append(v ^ (v >> 16))
    return [words32[2 * i] | (words32[2 * i + 1] << 32) for i in range(4)]


class Pcg64:
    """``numpy.random.default_rng(seed)`` for ``integers(low, high)`` and ``random()``."""

    def __init__(self, seed: int):
        s0, s1, i0, i1 = _seed_words(seed)
        self._inc = (((i0 << 64) | i1) << 1 | 1) & _M128
        self._state = 0
        self._step()
        self._state = (self._state + ((s0 << 64) | s1)) & _M128
        self._step()
        self._half: int | None = None  # the upper 32 bits of a 64-bit draw, kept for the next 32-bit one

    def _step(self) -> None:
        self._state = (self._state * _PCG_MULT + self._inc) & _M128

    def next64(self) -> int:
        self._step()
        hi, lo = self._state >> 64, self._state & _M64
        x, rot = hi ^ lo, hi >> 58
        return ((x >> rot) | (x << (64 - rot))) & _M64

    def next32(self) -> int:
        if self._half is not None:
            half, self._half = self._half, None
            return half
        n = self.next64()
        self._half = n >> 32
        return n & _M32

    def integers(self, low: int, high: int | None = None) -> int:
        """One integer in [low, high) (numpy's ``integers(high)`` when ``high`` is None)."""
        if high is None:
            low, high = 0, low
        span = high - 1 - low
        if span < 0:
            raise ValueError(f"integers: high {high} must be above low {low}")
        if span == 0:
            return low
        if span > _M32:
            raise ValueError(f"integers: range {span + 1} above 2**32 is not reproduced here")
        if span == _M32:
            return low + self.next32()
        excl = span + 1
        m = self.next32() * excl
        if (m & _M32) < excl:
            threshold = (_M32 - span) % excl
            while (m & _M32) < threshold:
                m = self.next32() * excl
        return low + (m >> 32)

    def random(self) -> float:
        return (self.next64() >> 11) * (1.0 / 9007199254740992.0)
