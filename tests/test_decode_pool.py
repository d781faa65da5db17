"""The decode threads of map-style batches (``fastdata.loaders.decode_pool``)."""

from __future__ import annotations

import pickle
import threading
import time

import pytest

from fastdata.loaders.decode_pool import DecodePool


def test_map_keeps_the_order_of_the_items():
    pool = DecodePool(3)
    try:
        assert pool.map(lambda x: x * x, list(range(100))) == [x * x for x in range(100)]
        assert pool.map(str, []) == []
        assert pool.map(str, [7]) == ["7"]
    finally:
        pool.close()


def test_a_thread_that_draws_a_slow_item_leaves_the_rest_to_the_others():
    """Items are claimed one at a time, not split into one fixed chunk per
    thread: while one thread decodes a large image, the others take the rest."""
    pool = DecodePool(2)
    seen: dict[int, str] = {}
    release = threading.Event()

    def work(x):
        seen[x] = threading.current_thread().name
        if x == 0:
            # Held until every other item is done (by the other thread).
            assert release.wait(10)
        elif len(seen) == 40:
            release.set()
        return x

    try:
        assert pool.map(work, list(range(40))) == list(range(40))
    finally:
        pool.close()
    slow = seen[0]
    assert [x for x, name in seen.items() if name == slow] == [0]


def test_an_error_is_raised_after_every_thread_has_stopped():
    pool = DecodePool(2)
    done = []

    def work(x):
        if x == 3:
            raise KeyError(x)
        time.sleep(0.001)
        done.append(x)
        return x

    try:
        with pytest.raises(KeyError):
            pool.map(work, list(range(20)))
        count = len(done)
        time.sleep(0.05)
        assert len(done) == count  # nothing still running
    finally:
        pool.close()


def test_one_thread_runs_inline_and_a_pickled_pool_has_no_threads():
    pool = DecodePool(1)
    assert pool.map(lambda x: threading.current_thread().name, [1, 2]) == \
        [threading.current_thread().name] * 2
    two = DecodePool(2)
    try:
        two.map(str, [1, 2, 3])
        copy = pickle.loads(pickle.dumps(two))
        assert copy._executor is None and copy.requested == 2
        assert copy.map(str, [1, 2, 3]) == ["1", "2", "3"]
        copy.close()
    finally:
        two.close()
