"""The shard methods of a dataset record whose parts are all sharded (no
torch): the parts' shards numbered one part after another, each read
through its part's selection. A base of
:class:`fastdata.dataset.reader.DatasetReader`; ``sharded`` says whether
they apply."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

#: Records read together when selected records are walked in order.
STEP = 256


class PartShards:
    """Shards of ``parts`` (readers), ``_first`` (each part's first position)
    and ``_selections`` (each part's, or None), provided by the reader."""

    def _shard_table(self) -> np.ndarray:
        table = self.__dict__.get("_shards")
        if table is None:
            self._need_shards()
            counts = [len(r.shard_paths) for r in self.parts]
            table = self._shards = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return table

    def _need_shards(self) -> None:
        if not self.sharded:
            raise TypeError(f"a {self.format_name} dataset has no shards")

    def _shard_part(self, shard: int) -> tuple[int, int]:
        table = self._shard_table()
        p = int(np.searchsorted(table, shard, side="right")) - 1
        return p, shard - int(table[p])

    @property
    def coalesce(self):
        self._need_shards()
        return self.parts[0].coalesce

    @coalesce.setter
    def coalesce(self, value) -> None:
        for reader, selection in zip(self.parts, self._selections):
            reader.coalesce = 0 if selection is not None else value

    @property
    def shard_paths(self) -> list[str]:
        self._need_shards()
        return [p for r in self.parts for p in r.shard_paths]

    def shard_sizes(self) -> list[int]:
        self._need_shards()
        return [s for r in self.parts for s in r.shard_sizes()]

    def shard_ranges(self) -> list[tuple[int, int]]:
        """(first position, record count) of every shard (0 records where a
        selection keeps none of it)."""
        self._need_shards()
        out = []
        for p, reader in enumerate(self.parts):
            first, selection = int(self._first[p]), self._selections[p]
            bounds = reader.shard_ranges()
            if selection is None:
                out += [(first + f, c) for f, c in bounds]
                continue
            edges = np.asarray([f for f, _ in bounds] + [len(reader)], np.int64)
            at = selection.rank(edges)
            out += [(first + int(at[k]), int(at[k + 1] - at[k])) for k in range(len(bounds))]
        return out

    def shard_copy(self, shard: int, cache=None) -> str:
        p, local = self._shard_part(shard)
        return self.parts[p].shard_copy(local, cache)

    def attach_local(self, shard: int, path: str) -> None:
        p, local = self._shard_part(shard)
        self.parts[p].attach_local(local, path)

    def detach_local(self, shard: int) -> None:
        p, local = self._shard_part(shard)
        self.parts[p].detach_local(local)

    def side_path(self, shard: int, suffix: str) -> str:
        p, local = self._shard_part(shard)
        return self.parts[p].side_path(local, suffix)

    def placement(self, indices) -> tuple[np.ndarray, np.ndarray]:
        table = self._shard_table()
        part, local = self.locate(indices)
        shards = np.empty(len(part), np.int64)
        sizes = np.empty(len(part), np.int64)
        for p in np.unique(part).tolist():
            here = part == p
            s, z = self.parts[p].placement(local[here])
            shards[here] = np.asarray(s, np.int64) + table[p]
            sizes[here] = np.asarray(z, np.int64)
        return shards, sizes

    def shards_of(self, indices: Sequence[int]) -> list[int]:
        shards, _ = self.placement(indices)
        return list(dict.fromkeys(shards.tolist()))

    def iter_shard(self, shard: int) -> Iterator[tuple[int, bytes]]:
        p, local = self._shard_part(shard)
        if self._selections[p] is None:
            first = int(self._first[p])
            for i, data in self.parts[p].iter_shard(local):
                yield first + i, data
            return
        first, count = self.shard_ranges()[shard]
        for lo in range(first, first + count, STEP):
            at = list(range(lo, min(first + count, lo + STEP)))
            yield from zip(at, self.read_many(at))
