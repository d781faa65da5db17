"""Properties of the order engine (fastdata.order), over random dataset sizes,
world sizes 1-8, workers 0-4, batch sizes, pad/drop and shuffle modes: every
rank gets the same number of batches; an epoch's union is the dataset (the
padding stated, no other repeats); the job consumes the order as a prefix, so
a resume from any position, once or twice, with another world size or worker
count, continues the uninterrupted sequence."""

from __future__ import annotations

from collections import Counter

import numpy as np
import optional

from fastdata.order.epochs import Shuffle, epoch_order, permutation
from fastdata.order.slices import Slice, batches_delivered, worker_batches
from fastdata.order.state import worker_positions

optional.require("hypothesis")  # the test extra: without it, this module skips
from hypothesis import given, settings
from hypothesis import strategies as st

SHUFFLES = st.one_of(
    st.just(Shuffle(False)),
    st.builds(Shuffle, st.just(True), st.integers(0, 2**32), st.integers(1, 40),
              st.integers(1, 300)),
    st.builds(lambda seed: Shuffle(True, seed, 1, 10**9), st.integers(0, 2**32)),
)
CASES = dict(n=st.integers(0, 400), world=st.integers(1, 8), batch=st.integers(1, 16),
             policy=st.sampled_from(["pad", "drop"]), shuffle=SHUFFLES,
             epoch=st.integers(0, 5))


def _rank_batches(n, start, world, rank, batch, policy, order) -> list[list[int]]:
    plan = Slice(n, start, world, rank, batch, policy)
    return [plan.record_indices(order, np.arange(r.start, r.stop)).tolist()
            for r in map(plan.batch_positions, range(plan.batches()))]


def _job(n, start, world, batch, policy, order) -> list[int]:
    """The records the whole job consumes, batch round by batch round."""
    per_rank = [_rank_batches(n, start, world, r, batch, policy, order) for r in range(world)]
    return [i for t in range(len(per_rank[0])) for r in range(world) for i in per_rank[r][t]]


@settings(max_examples=300, deadline=None)
@given(**CASES)
def test_equal_batches_and_an_epoch_is_the_dataset(n, world, batch, policy, shuffle, epoch):
    order = epoch_order(n, shuffle, epoch)
    assert sorted(order[:].tolist()) == list(range(n))  # a permutation
    per_rank = [_rank_batches(n, 0, world, r, batch, policy, order) for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1  # the same number of batches
    assert len({sum(map(len, b)) for b in per_rank}) == 1  # and of samples
    seen = Counter(i for b in per_rank for batch_ in b for i in batch_)
    plan = Slice(n, 0, world, 0, batch, policy)
    if policy == "pad":
        assert set(seen) == set(range(n))
        assert sum(seen.values()) - n == plan.repeats < world
    else:
        # Fewer than one sample per rank, and each rank's partial last batch.
        assert all(c == 1 for c in seen.values()) and n - len(seen) == plan.dropped
        assert plan.dropped == n - world * (n // world // batch * batch) < world * batch
        assert all(len(b) == batch for p in per_rank for b in p)  # whole batches only
    assert _job(n, 0, world, batch, policy, order)[:min(n, len(seen))] == \
        order[:min(n, len(seen))].tolist()  # a prefix of the order


@settings(max_examples=300, deadline=None)
@given(**CASES, world2=st.integers(1, 8), world3=st.integers(1, 8), data=st.data())
def test_a_resume_anywhere_continues_the_sequence(n, world, batch, policy, shuffle, epoch,
                                                  world2, world3, data):
    """Resume after k batches of every rank, then again after k2 with other
    ranks: the consumed records and what follows are the uninterrupted run's."""
    order = epoch_order(n, shuffle, epoch)
    full = order[:].tolist()
    plan = Slice(n, 0, world, 0, batch, policy)
    k = data.draw(st.integers(0, plan.batches()))
    first = _job(n, 0, world, batch, policy, order)[:world * k * batch]
    at = plan.consumed_after(k)
    second_plan = Slice(n, at, world2, 0, batch, policy)
    k2 = data.draw(st.integers(0, second_plan.batches()))
    second = _job(n, at, world2, batch, policy, order)[:world2 * k2 * batch]
    at2 = second_plan.consumed_after(k2)
    rest = _job(n, at2, world3, batch, policy, order)
    consumed = first + second + rest
    # Up to the end of the order, the same records as one uninterrupted pass,
    # in the same order; beyond it only the padding of the part that reached
    # the end (fewer repeats than its ranks).
    assert consumed[:n] == full[:len(consumed[:n])]
    if policy == "pad" and n:
        assert set(consumed) == set(full)
        assert len(consumed) - n < max(world, world2, world3)
    else:
        assert len(consumed) == len(set(consumed))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), world=st.integers(1, 4), batch=st.integers(1, 8),
       workers=st.integers(1, 4), policy=st.sampled_from(["pad", "drop"]), data=st.data())
def test_workers_take_a_ranks_batches_in_turn(n, world, batch, workers, policy, data):
    """Worker k of K reads the rank's batches k, k+K, ...; batches delivered in
    turn give back the rank's sequence, and the count per worker is a prefix."""
    plan = Slice(n, 0, world, data.draw(st.integers(0, world - 1)), batch, policy)
    total = plan.batches()
    per_worker = [np.asarray(worker_positions(plan, w, workers)).tolist() for w in range(workers)]
    rank_positions = [p for t in range(total) for p in plan.batch_positions(t)]
    taken = [0] * workers
    delivered = []
    for t in range(total):  # the DataLoader takes batches from its workers in turn
        w = t % workers
        size = len(plan.batch_positions(t))
        delivered += per_worker[w][taken[w]:taken[w] + size]
        taken[w] += size
    assert delivered == rank_positions
    done = data.draw(st.integers(0, total))
    counts = [len(worker_batches(done, w, workers)) for w in range(workers)]
    assert batches_delivered(counts, total, workers) == done


def test_the_permutation_is_the_documented_one():
    assert permutation(10, 7).tolist() == \
        np.random.Generator(np.random.PCG64(7)).permutation(10).tolist()
    assert epoch_order(5, Shuffle(False), 3)[:].tolist() == [0, 1, 2, 3, 4]
    a, b = (epoch_order(1000, Shuffle(True, 1, 1, 10**6), e)[:] for e in (0, 1))
    assert sorted(a.tolist()) == list(range(1000)) and a.tolist() != b.tolist()
