"""ShardedIterableDataset under real torch.distributed: 2 gloo ranks on the CPU,
each with a DataLoader of 2 forked workers, over 4 tar shards."""

from __future__ import annotations

import textwrap
from collections import Counter

import pytest

import fastdata

from conftest import build_tree, run_ranks, uniform_spec

WORLD = 2
EPOCHS = 2

RANK_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    import fastdata

    init, rank, world, out, manifest, context, epochs = sys.argv[1:8]
    rank, world, epochs = int(rank), int(world), int(epochs)
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=world)
    try:
        results = {}
        # Spawned workers cost a fresh interpreter each: one pass is enough there.
        for shuffle in (False, True) if epochs > 1 else (False,):
            ds = fastdata.ShardedIterableDataset(
                manifest, decode=fastdata.Decode(output="bytes"),
                order=fastdata.Order(shuffle=shuffle, window=3, seed=11))
            for epoch in range(epochs):
                ds.set_epoch(epoch)
                loader = DataLoader(ds, batch_size=None, num_workers=2,
                                    multiprocessing_context=context)
                results[f"{shuffle}-{epoch}"] = [[data.hex(), label] for data, label in loader]
        # Every rank sees everyone's results too: the collective itself must work.
        gathered = [None] * world
        dist.all_gather_object(gathered, {k: len(v) for k, v in results.items()})
        with open(out, "w") as f:
            json.dump({"rank": rank, "results": results, "gathered": gathered}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
""")


def _run_ranks(manifest: str, tmp_path, context: str, epochs: int) -> list[dict]:
    return run_ranks(RANK_SCRIPT, WORLD, [manifest, context, epochs], tmp_path, timeout=120,
                     name=f"rank-{context}-")


@pytest.fixture
def four_shards(tmp_path):
    tree = build_tree(tmp_path / "src", uniform_spec(per_class=4), size=(8, 8))  # 12 images
    summary = fastdata.pack(tree.root, tmp_path / "out" / "ds.tar",
                            options=fastdata.PackOptions(shard_size=3), progress=False)
    assert len(fastdata.formats.read_manifest(summary.output).shards) == 4
    return tree, summary.output


def _check_split(ranks: list[dict], tree) -> None:
    expected = Counter((s.data.hex(), s.label) for s in tree.samples)
    assert [r["rank"] for r in ranks] == list(range(WORLD))
    for run in ranks[0]["results"]:
        per_rank = [[tuple(x) for x in r["results"][run]] for r in ranks]
        # 4 shards over 2 ranks x 2 workers: one shard (3 samples) per worker.
        assert [len(p) for p in per_rank] == [6, 6], run
        assert Counter(x for p in per_rank for x in p) == expected, run
        assert not set(per_rank[0]) & set(per_rank[1]), run
        assert ranks[0]["gathered"] == ranks[1]["gathered"]


def test_two_ranks_two_workers_each_sample_once_per_epoch(four_shards, tmp_path):
    tree, manifest = four_shards
    ranks = _run_ranks(manifest, tmp_path, "fork", EPOCHS)
    _check_split(ranks, tree)
    assert len(ranks[0]["results"]) == 2 * EPOCHS
    # Shuffled epochs differ from each other but each still covers everything once.
    shuffled = [[tuple(x) for r in ranks for x in r["results"][f"True-{e}"]]
                for e in range(EPOCHS)]
    assert shuffled[0] != shuffled[1]
    unshuffled = [[tuple(x) for r in ranks for x in r["results"][f"False-{e}"]]
                  for e in range(EPOCHS)]
    assert unshuffled[0] == unshuffled[1]


@pytest.mark.slow
def test_spawned_workers_get_the_rank_from_the_parent(four_shards, tmp_path):
    # A spawned DataLoader worker has no process group; the dataset carries the
    # parent's rank and world size across pickling.
    tree, manifest = four_shards
    _check_split(_run_ranks(manifest, tmp_path, "spawn", 1), tree)
