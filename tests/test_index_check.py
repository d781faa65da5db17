"""The index check of sharded datasets (``fastdata verify``) reads the index
in chunks: the problems it reports do not depend on where the chunks end."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import no_hang

from fastdata.formats.sharded.integrity import index_problems
from fastdata.formats.sharded.layout import INDEX_DTYPE



def _index(rng, shards: int, per_shard: int) -> tuple[np.ndarray, list[dict], list[str]]:
    rows = np.zeros(shards * per_shard, INDEX_DTYPE)
    infos, paths = [], []
    for s in range(shards):
        sizes = rng.integers(10, 100, per_shard)
        offsets = np.cumsum(np.r_[0, sizes[:-1]])
        part = rows[s * per_shard:(s + 1) * per_shard]
        part["shard"], part["offset"], part["size"] = s, offsets, sizes
        infos.append({"path": f"s-{s}.tar", "count": per_shard, "bytes": int(sizes.sum())})
        paths.append(f"/data/s-{s}.tar")
    return rows, infos, paths


def _chunks(rows: np.ndarray, size: int):
    return (rows[at:at + size] for at in range(0, len(rows), size))


@pytest.mark.parametrize("damage", ["none", "shard", "order", "past", "overlap", "count",
                                    "many"])
def test_the_problems_are_the_same_whatever_the_chunks(damage):
    rng = np.random.default_rng(7)
    rows, infos, paths = _index(rng, 4, 9)
    if damage == "shard":
        rows["shard"][[5, 20]] = 9
    elif damage == "order":
        rows["shard"][10] = 3
    elif damage == "past":
        rows["offset"][17] = 10_000
    elif damage == "overlap":
        rows["offset"][12] = rows["offset"][11]
    elif damage == "count":
        infos[2]["count"] = 8
    elif damage == "many":
        rows["offset"][1:30:2] = rows["offset"][0:29:2]
    with no_hang(30):
        whole = index_problems([rows], infos, paths, "/data/idx")
        for size in (1, 2, 5, 9, 64):
            assert index_problems(_chunks(rows, size), infos, paths, "/data/idx") == whole
    if damage == "none":
        assert whole == []
    else:
        assert whole, damage
    if damage == "overlap":
        assert [p["index"] for p in whole] == [12]
        assert "before row 11 ends" in whole[0]["reason"]
    if damage == "many":
        # Row 9, shard 1's first, took shard 0's last offset: past shard 1's end.
        assert [p["index"] for p in whole] == [9, 1, 3, 5, 7, 10, None]
        assert whole[-1]["reason"] == "10 more index rows like these"
