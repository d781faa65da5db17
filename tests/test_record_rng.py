"""The random stream of one record (``fastdata.decoding.record_rng``)."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata.decoding.record_rng import RecordRNG


def draws(rng: RecordRNG, n: int) -> list[float]:
    return [rng.random() for _ in range(n)]


def test_a_record_gets_the_same_numbers_every_time_and_others_get_others():
    assert draws(RecordRNG(1, 2, 3), 40) == draws(RecordRNG(1, 2, 3), 40)
    streams = {tuple(draws(RecordRNG(*key), 4))
               for key in [(1, 2, 3), (1, 2, 4), (1, 3, 3), (2, 2, 3), (12, 3, 4), (1, 23, 4),
                           (0, 0, 0), (2 ** 80, 0, 0), (0, 0, 2 ** 70)]}
    assert len(streams) == 9
    # More than one hash block (8 words each): the stream goes on without repeating.
    long = draws(RecordRNG(5, 0, 0), 100)
    assert len(set(long)) == 100


def test_the_numbers_are_uniform_and_in_range():
    values = np.array([v for i in range(2000) for v in draws(RecordRNG(7, 1, i), 5)])
    assert values.min() >= 0.0 and values.max() < 1.0
    # Ten bins of 10,000 draws: a chi-square far below what chance allows (p < 1e-6 at 50).
    counts, _ = np.histogram(values, bins=10, range=(0.0, 1.0))
    expected = len(values) / 10
    assert ((counts - expected) ** 2 / expected).sum() < 50
    # Successive draws are uncorrelated.
    assert abs(np.corrcoef(values[:-1], values[1:])[0, 1]) < 0.03
    u = [RecordRNG(3, 0, i).uniform(-2.0, 5.0) for i in range(2000)]
    assert min(u) >= -2.0 and max(u) < 5.0 and abs(np.mean(u) - 1.5) < 0.2


def test_integers_cover_their_range_evenly():
    rng = RecordRNG(9, 9, 9)
    ints = [rng.integers(3, 9) for _ in range(6000)]
    assert set(ints) == set(range(3, 9))
    counts = np.bincount(ints)[3:]
    assert ((counts - 1000) ** 2 / 1000).sum() < 40
    assert {RecordRNG(0, 0, i).integers(0, 1) for i in range(20)} == {0}
    with pytest.raises(ValueError, match="low < high"):
        rng.integers(4, 4)


def test_negative_keys_are_refused():
    with pytest.raises(ValueError, match="non-negative"):
        RecordRNG(0, -1, 0)
