"""The datasets of ``bench/scale_jobs.py``, written once per size: tiny
planted records (a TFRecord dataset written by the format's writer), the
join's table of their keys, a packed copy for the append, and the sources
the pack and append jobs read."""

from __future__ import annotations

import os
import shutil

from scale import TinySource

#: One record in this many is a copy of the one before it.
PLANT_EVERY = 100_003
#: One record in this many has no row in the join's table.
JOIN_SKIP_EVERY = 7
#: The subset job's test (label 3 and the first 100 keys fail), then half.
SUBSET_WHERE = "label != 3 and key >= '0000000100'"


class PlantedSource(TinySource):
    """``n`` records of 12 bytes (the record's number, with planted copies);
    the rest as ``bench/scale.py``'s TinySource."""

    def __iter__(self):
        from fastdata.packers.source import SourceEntry

        for i in range(self.n):
            yield SourceEntry(key=f"{i:010d}", label=i % 10, data=record_bytes(i),
                              raw_shape=(1, 4, 3))

    def describe(self) -> dict:
        return {"root": None, "files": self.n, "kind": "bench/scale_jobs.py records"}


class AppendedSource(PlantedSource):
    """What the append job adds to the dataset of ``n`` records: ``n // 10``
    records, keys going on from ``n - n // 1000``."""

    def __init__(self, n: int) -> None:
        super().__init__(n // 10)
        self.first = n - n // 1000

    def __iter__(self):
        from fastdata.packers.source import SourceEntry

        for i in range(self.first, self.first + self.n):
            yield SourceEntry(key=f"{i:010d}", label=i % 10, data=record_bytes(i),
                              raw_shape=(1, 4, 3))

    def describe(self) -> dict:
        return {"root": None, "files": self.n, "first": self.first,
                "kind": "bench/scale_jobs.py appended records"}


def subset_selected(n: int) -> int:
    """Records the subset job selects of ``n``."""
    labelled = n - (n + 6) // 10  # label i % 10 is 3 for (n + 6) // 10 of them
    passed = labelled - sum(1 for i in range(min(n, 100)) if i % 10 != 3)
    return round(passed * 0.5)


def record_bytes(i: int) -> bytes:
    if i % PLANT_EVERY == PLANT_EVERY - 1:
        i -= 1  # a copy of the record before it
    return i.to_bytes(12, "little")


def planted_groups(n: int) -> int:
    return n // PLANT_EVERY


def write_dataset(folder: str, n: int) -> str:
    """The dataset of ``n`` records, written by the TFRecord writer alone."""
    from fastdata.formats import get_format
    from fastdata.records import Manifest, Record

    out = os.path.join(folder, f"records{n}.tfrecord")
    if os.path.exists(out + ".fastdata.json"):
        return out  # written by an earlier run into the same --dir
    source = PlantedSource(n)
    writer = get_format("tfrecord").load_writer()(out, shard_size=10_000)
    for i, entry in enumerate(source):
        writer.write(Record(i, entry.key, entry.label, entry.data, "raw"))
    writer.finish(Manifest("tfrecord", n, source.classes, [n // 10] * 10, {}, {}, {}, [],
                           {}, {}, "", ""))
    return out


def write_table(folder: str, n: int) -> str:
    """The join's table for ``n`` records (see the module's docstring)."""
    out = os.path.join(folder, f"keys{n}.jsonl")
    if os.path.exists(out):
        return out
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        for i in range(n):
            if i % JOIN_SKIP_EVERY != JOIN_SKIP_EVERY - 1:
                f.write(f'{{"key": "{i:010d}", "caption": "record {i}", "score": {i / 4}}}\n')
            if i % 1000 == 999:
                f.write(f'{{"key": "ghost{i:010d}", "caption": "-", "score": 0.0}}\n')
    os.replace(out + ".tmp", out)
    return out


def write_packed(folder: str, n: int) -> str:
    """The dataset of ``n`` records packed by ``fastdata.pack`` (the append's)."""
    import fastdata

    out = os.path.join(folder, f"packed{n}.tfrecord")
    if not os.path.exists(out + ".fastdata.json"):
        fastdata.pack(PlantedSource(n), out, options=fastdata.PackOptions(shard_size=10_000),
                      progress=False)
    return out


def joined_records(n: int) -> int:
    return n - n // JOIN_SKIP_EVERY


def copy_dataset(path: str, folder: str) -> str:
    """A copy of the dataset ``path`` (its files, not its versions) in ``folder``."""
    source, stem = os.path.split(path)
    base = stem.split(".")[0]
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(source):
        if name.startswith((base + ".", base + "-")) and \
                os.path.isfile(os.path.join(source, name)):
            shutil.copyfile(os.path.join(source, name), os.path.join(folder, name))
    return os.path.join(folder, stem)
