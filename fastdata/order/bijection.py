"""A keyed pseudo-random bijection on ``[0, n)``, computed per position.

The order engine never makes an array of a dataset's size: the record at
position ``p`` of an epoch is ``Bijection(n, key).at(p)``, for a batch of
positions at once (numpy, O(batch) time, O(1) state). It is a Feistel
network on the smallest number of bits that holds ``n - 1`` (a domain under
``2n``; its two parts differ by at most a bit), made a bijection on
``[0, n)`` by cycle-walking: a value that lands at ``n`` or above is
encrypted again until it is below ``n``, which on average takes fewer than
two passes.

The round function is the splitmix64 finaliser of one part mixed with
a round key: a strong 64-bit mixer, so a few rounds give orders whose
displacement, neighbour correlation and class mixing match a uniform random
permutation's (``bench/order_quality.py`` measures them against numpy's).

Keys may be one 64-bit integer or an array of them, one per position (a
window's own permutation in the stream order). ``ALGORITHM`` names this
construction in resume states: a state made by another order algorithm is
refused, not continued in a different order.

Nothing here imports torch; nothing grows with ``n``.
"""

from __future__ import annotations

import numpy as np

#: The order algorithm's version, recorded in every resume state. 1 was a
#: numpy permutation of every record per epoch; 2 is this Feistel bijection.
ALGORITHM = 2
#: Feistel rounds: four make a strong pseudo-random permutation of a good
#: round function (Luby-Rackoff); two more for margin on small domains.
ROUNDS = 6
#: Positions computed at a time (their temporaries stay in the CPU's cache).
CHUNK = 1 << 16

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)


_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on a uint64 array (wrapping
    arithmetic, which numpy arrays do without a warning)."""
    x = np.array(x, dtype=np.uint64, ndmin=1)
    x ^= x >> _S30
    x *= _MUL1
    x ^= x >> _S27
    x *= _MUL2
    x ^= x >> _S31
    return x


def distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct values and where each value is among them
    (``np.unique(values, return_inverse=True)``, without its lazy import of
    ``numpy.ma``, which fails when the process has no descriptor left)."""
    flat = np.asarray(values).reshape(-1)
    ordered = np.sort(flat)
    keep = np.ones(len(ordered), dtype=bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    values_ = ordered[keep]
    return values_, np.searchsorted(values_, flat)


def subkeys(key, count: int) -> np.ndarray:
    """``count`` keys drawn from ``key`` (an integer or an array of them):
    shape ``(count, *key.shape)``, uint64."""
    base = np.asarray(key, dtype=np.uint64)
    steps = np.arange(1, count + 1, dtype=np.uint64).reshape((count,) + (1,) * base.ndim)
    steps *= _GOLDEN
    return mix64(base ^ steps).reshape((count,) + base.shape)


class Bijection:
    """A keyed permutation of ``range(n)``, evaluated at any positions.

    Args:
        n: the domain's size, 0 to 2**62.
        key: a 64-bit key (an int), or a uint64 array with one key per
            position given to :meth:`at` (each position then has its own
            permutation; they share ``n``).
    """

    def __init__(self, n: int, key) -> None:
        n = int(n)
        if not 0 <= n <= 1 << 62:
            raise ValueError(f"a bijection's domain is 0 to 2**62 values, not {n}")
        self.n = n
        # The smallest number of bits that holds n - 1 (at least 2): a domain
        # under 2n, cut into a high part of hi bits and a low part of lo bits.
        self.bits = max(2, (n - 1).bit_length())
        self.lo = self.bits - self.bits // 2
        key = np.asarray(key, dtype=np.uint64)
        if key.ndim:  # one key per position: each distinct key's round keys once
            keys, where = distinct(key)
            self._round_keys = subkeys(keys, ROUNDS)[:, where].reshape(
                (ROUNDS, *key.shape))
        else:
            self._round_keys = subkeys(key, ROUNDS)

    def _encrypt(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """One pass of the (unbalanced) Feistel network over ``self.bits`` bits:
        each round mixes the low part into the high part, then swaps them."""
        lo_bits = self.lo
        for r in range(ROUNDS):
            hi_bits = self.bits - lo_bits
            lo_mask = np.uint64((1 << lo_bits) - 1)
            hi = x >> np.uint64(lo_bits)
            f = (x & lo_mask) ^ keys[r]  # the round function, in place: mix64(lo ^ key)
            f ^= f >> _S30
            f *= _MUL1
            f ^= f >> _S27
            f *= _MUL2
            f ^= f >> _S31
            f &= np.uint64((1 << hi_bits) - 1)
            f ^= hi
            x = ((x & lo_mask) << np.uint64(hi_bits)) | f  # the low part goes on top
            lo_bits = hi_bits
        return x

    def at(self, positions) -> np.ndarray:
        """The values at ``positions`` (integers in ``[0, n)``), int64, in their shape.

        Raises:
            IndexError: a position outside ``[0, n)``.
        """
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= self.n):
            bad = pos[(pos < 0) | (pos >= self.n)].flat[0]
            raise IndexError(f"position {int(bad)} is outside an order of {self.n}")
        if self.n <= 1:
            return pos.copy()
        keys = self._round_keys
        if keys.ndim > 1:
            keys = np.broadcast_to(keys, (ROUNDS, *pos.shape))
        flat_keys = keys.reshape(ROUNDS, -1) if keys.ndim > 1 else keys
        x = pos.reshape(-1).astype(np.uint64)
        for lo in range(0, x.size, CHUNK):  # temporaries that stay in the CPU's cache
            part = slice(lo, lo + CHUNK)
            x[part] = self._walk(x[part], flat_keys[:, part] if flat_keys.ndim > 1
                                 else flat_keys)
        return x.astype(np.int64).reshape(pos.shape)

    def _walk(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Cycle-walking: encrypt again the values at ``n`` or above."""
        n = np.uint64(self.n)
        x = self._encrypt(x, keys)
        todo = np.flatnonzero(x >= n)
        while todo.size:
            x[todo] = self._encrypt(x[todo], keys[:, todo] if keys.ndim > 1 else keys)
            todo = todo[x[todo] >= n]
        return x
