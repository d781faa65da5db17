"""Sources beyond the image folder: CSV/TSV and JSON Lines lists, Parquet tables
in the Hugging Face layout, and ``open_source`` choosing between them.

Every list and table is written here, in ``tmp_path``, with the csv/json modules
and pyarrow, next to image files made by conftest's ``make_image_bytes``.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import sys
from pathlib import Path

import optional
import pytest
from click.testing import CliRunner
from conftest import build_tree, list_partials, make_image_bytes, run_python

import fastdata
from fastdata.cli import main
from fastdata.errors import BadImageError, FastDataError, SourceError, UnsafeNameError
from fastdata.ops.verify import verify_dataset
from fastdata.packers.pack import PackOptions
from fastdata.packers.source import SourceEntry

pa = optional.require("pyarrow")
pq = optional.require("pyarrow", "pyarrow.parquet")

FORMATS = [".lmdb", ".h5", ".tfrecord", ".tar"]
KINDS = ["csv", "tsv", "jsonl", "parquet"]

#: (path as the list gives it, class name): spaces, dots, commas, unicode; not sorted.
LISTED = [
    ("dog/v1.2.final.bmp", "dog"),
    ("cat/a b.png", "cat"),
    ("ant/\u65e5\u672c \u00fcn\u00ef.webp", "ant"),
    ("cat/x.y.z.jpg", "cat"),
    ("dog/comma, here.png", "dog"),
    ("ant/deep/er/.dotted.tif", "ant"),
]
#: The ClassLabel names the Parquet table declares (not sorted: they come from it).
HF_NAMES = ["dog", "cat", "ant"]


class Listed:
    """Image files beside a list file's folder, and what a pack must give back."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rows: list[tuple[str, str, bytes]] = []  # (path as listed, class, bytes)
        for path, cls in LISTED:
            self.rows.append((path, cls, self._write(root / path, path)))
        # One file listed through a '..' that stays inside the list's folder
        # (paths that leave it are refused: tests/test_contained.py).
        self.rows.append(("dog/../zebra crossing.png", "cat",
                          self._write(root / "zebra crossing.png", "outside")))

    @staticmethod
    def _write(path: Path, name: str) -> bytes:
        data = make_image_bytes(path.suffix, name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return data

    @property
    def keys(self) -> list[str]:
        return [p for p, _, _ in self.rows]

    @property
    def payloads(self) -> list[bytes]:
        return [d for _, _, d in self.rows]

    def labels(self, classes: list[str]) -> list[int]:
        return [classes.index(c) for _, c, _ in self.rows]

    def write(self, kind: str, name: str = "list") -> Path:
        """The list (or table) of every row, with a label and a metadata column."""
        if kind in ("csv", "tsv"):
            return write_csv(self.root / f"{name}.{kind}", ["path", "label", "note"],
                             [[p, c, f"note {i}"] for i, (p, c, _) in enumerate(self.rows)],
                             delimiter="\t" if kind == "tsv" else ",")
        if kind == "jsonl":
            return write_jsonl(self.root / f"{name}.jsonl",
                               [{"path": p, "label": c, "note": f"note {i}"}
                                for i, (p, c, _) in enumerate(self.rows)])
        return write_hf_parquet(self.root / f"{name}.parquet",
                                [{"bytes": d, "path": p} for p, _, d in self.rows],
                                [HF_NAMES.index(c) for _, c, _ in self.rows], HF_NAMES,
                                note=[f"note {i}" for i in range(len(self.rows))])


def write_csv(path: Path, header, rows, *, delimiter: str = ",") -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, objects) -> Path:
    path.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objects),
                    encoding="utf-8")
    return path


def image_type():
    return pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def hf_schema_metadata(names: list[str] | None) -> dict:
    """The ``huggingface`` schema metadata as ``datasets`` writes it (``_build_metadata``:
    ``{"info": {"features": Features.to_dict()}}``)."""
    features = {"image": {"decode": True, "id": None, "_type": "Image"}}
    if names is not None:
        features["label"] = {"names": names, "id": None, "_type": "ClassLabel"}
    return {"huggingface": json.dumps({"info": {"features": features}})}


def write_hf_parquet(path: Path, images: list[dict], labels: list | None,
                     names: list[str] | None = None, *, row_group_size: int = 3,
                     **columns) -> Path:
    """A table in the Hugging Face image layout: ``image`` (struct of bytes and
    path), ``label`` (int64, a ClassLabel when ``names``), other columns as given."""
    data = {"image": pa.array(images, type=image_type())}
    if labels is not None:
        data["label"] = pa.array(labels, type=pa.int64())
    data.update({k: pa.array(v) for k, v in columns.items()})
    table = pa.table(data).replace_schema_metadata(hf_schema_metadata(names))
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def expected_classes(kind: str) -> list[str]:
    return HF_NAMES if kind == "parquet" else sorted(HF_NAMES)


def read_all(path) -> tuple[list, object]:
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"))
    return [ds[i] for i in range(len(ds))], ds


def assert_clean_cli_error(result, *needles) -> None:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def listed(tmp_path) -> Listed:
    return Listed(tmp_path / "data")


# -- every source into every format --------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", KINDS)
def test_each_source_packs_into_each_format_bit_for_bit(listed, tmp_path, kind, fmt):
    source = listed.write(kind)
    out = tmp_path / f"out{fmt}"
    summary = fastdata.pack(source, out, progress=False)
    classes = expected_classes(kind)
    got, ds = read_all(out)
    assert got == list(zip(listed.payloads, listed.labels(classes)))
    assert ds.classes == classes
    assert ds.keys == listed.keys
    assert summary.records == len(listed.rows) and not summary.skipped
    described = ds.manifest.source
    assert described["kind"] == kind
    assert described["root"] == source.name  # the name: no machine's folders
    assert described["label_column"] == "label"


@pytest.mark.parametrize("kind", KINDS)
def test_paths_out_of_the_list_folder_need_allow_outside(listed, tmp_path, kind):
    """An absolute path (or '..' out of the folder) is refused, naming the
    line or row; a list of your own with ``allow_outside=True`` packs it."""
    outside = tmp_path / "elsewhere" / "zebra crossing.png"
    data = Listed._write(outside, "outside")
    for hostile in (str(outside), "../elsewhere/zebra crossing.png"):
        if kind == "parquet":  # no bytes: the path is read
            path = write_hf_parquet(listed.root / "out.parquet", [{"bytes": None,
                                                                   "path": hostile}],
                                    [0], HF_NAMES)
        elif kind == "jsonl":
            path = write_jsonl(listed.root / "out.jsonl", [{"path": hostile, "label": "cat"}])
        else:
            path = write_csv(listed.root / f"out.{kind}", ["path", "label"], [[hostile, "cat"]],
                             delimiter="\t" if kind == "tsv" else ",")
        where = "row 0" if kind == "parquet" else "line 1" if kind == "jsonl" else "line 2"
        with pytest.raises(UnsafeNameError, match=where):
            fastdata.pack(path, tmp_path / f"refused-{kind}.lmdb", progress=False)
        assert not (tmp_path / f"refused-{kind}.lmdb").exists()
        out = tmp_path / f"{kind}-{len(hostile)}.lmdb"
        fastdata.pack(fastdata.open_source(path, allow_outside=True), out, progress=False)
        got, ds = read_all(out)
        assert got[0][0] == data and ds.keys == [hostile]
        ds.close()


def test_csv_class_names_are_sorted_like_imagefolder(listed):
    src = fastdata.CSVSource(listed.write("csv"))
    assert src.classes == ["ant", "cat", "dog"]
    assert src.class_to_idx == {"ant": 0, "cat": 1, "dog": 2}
    assert [e.label for e in src] == listed.labels(src.classes)
    assert src.describe()["labels"] == "names"


def test_integer_labels_are_kept_and_classes_count_up_to_the_largest(listed):
    path = write_csv(listed.root / "ints.csv", ["path", "label"],
                     [[p, str(i * 2)] for i, (p, _, _) in enumerate(listed.rows)])
    src = fastdata.open_source(path)
    assert [e.label for e in src] == [i * 2 for i in range(len(listed.rows))]
    top = 2 * (len(listed.rows) - 1)
    assert src.classes == [str(i) for i in range(top + 1)]
    assert src.describe()["labels"] == "integers"


def test_jsonl_integer_labels_and_string_labels_differ_by_json_type(listed):
    objs = [{"path": p, "label": i % 2} for i, (p, _, _) in enumerate(listed.rows)]
    src = fastdata.open_source(write_jsonl(listed.root / "a.jsonl", objs))
    assert src.classes == ["0", "1"]
    objs = [{"path": p, "label": str(i % 2)} for i, (p, _, _) in enumerate(listed.rows)]
    src = fastdata.open_source(write_jsonl(listed.root / "b.jsonl", objs))
    assert src.classes == ["0", "1"] and src.describe()["labels"] == "names"


def test_other_csv_columns_are_metadata_as_text(listed):
    path = write_csv(listed.root / "m.csv", ["id", "path", "w", "label", "empty"],
                     [["007", p, "0.5", c, ""] for p, c, _ in listed.rows])
    entries = list(fastdata.open_source(path))
    assert entries[0].metadata == {"id": "007", "w": "0.5", "empty": ""}
    assert fastdata.open_source(path).describe()["metadata_columns"] == ["id", "w", "empty"]


def test_a_csv_with_only_paths_has_no_metadata(listed):
    path = write_csv(listed.root / "p.csv", ["path"], [[p] for p, _, _ in listed.rows])
    assert {e.metadata for e in fastdata.open_source(path)} == {None}


def test_jsonl_metadata_keeps_nested_values_as_they_are(listed):
    objs = []
    for i, (p, c, _) in enumerate(listed.rows):
        obj = {"path": p, "label": c,
               "objects": {"bbox": [[1.5, 2, 30, 40], [0, 0, 8, 8]], "category": [i, 0]},
               "caption": "\u00e9t\u00e9 \u2603", "score": 0.25, "tags": [], "extra": None}
        if i == 1:
            obj["only_here"] = {"deep": [{"x": [1, [2, [3]]]}]}
        objs.append(obj)
    entries = list(fastdata.open_source(write_jsonl(listed.root / "n.jsonl", objs)))
    assert len(entries) == len(objs)  # every row, none dropped
    for entry, obj in zip(entries, objs):
        assert entry.metadata == {k: v for k, v in obj.items() if k not in ("path", "label")}
    assert entries[1].metadata["only_here"] == {"deep": [{"x": [1, [2, [3]]]}]}


def test_custom_column_names(listed, tmp_path):
    path = write_csv(listed.root / "c.csv", ["file", "species", "label"],
                     [[p, c, "ignored"] for p, c, _ in listed.rows])
    src = fastdata.open_source(path, path_column="file", label_column="species")
    assert src.classes == ["ant", "cat", "dog"]
    assert [e.metadata for e in src] == [{"label": "ignored"}] * len(listed.rows)
    result = CliRunner().invoke(main, ["pack", str(path), str(tmp_path / "c.lmdb"),
                                       "--path-column", "file", "--label-column", "species"])
    assert result.exit_code == 0, result.output
    got, ds = read_all(tmp_path / "c.lmdb")
    assert got == list(zip(listed.payloads, listed.labels(ds.classes)))
    assert ds.manifest.source["path_column"] == "file"


def test_the_cli_packs_a_list_and_a_parquet_source(listed, tmp_path):
    for kind in ("tsv", "parquet"):
        out = tmp_path / f"cli-{kind}.tar"
        result = CliRunner().invoke(main, ["pack", str(listed.write(kind)), str(out),
                                           "--json", "--no-progress"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["records"] == len(listed.rows)
        assert read_all(out)[0] == list(zip(listed.payloads,
                                            listed.labels(expected_classes(kind))))
    help_text = CliRunner().invoke(main, ["pack", "--help"]).output
    assert "--path-column" in help_text and "--label-column" in help_text


# -- unlabelled records ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_list_without_labels_packs_unlabelled_records_in_every_format(listed, tmp_path,
                                                                        fmt):
    path = write_csv(listed.root / "u.csv", ["path", "note"],
                     [[p, "n"] for p, _, _ in listed.rows])
    src = fastdata.open_source(path)
    assert src.classes == [] and {e.label for e in src} == {-1}
    out = tmp_path / f"u{fmt}"
    summary = fastdata.pack(path, out, progress=False)
    assert summary.classes == 0
    got, ds = read_all(out)
    assert got == [(d, -1) for d in listed.payloads]
    assert ds.classes == [] and ds.class_to_idx == {}
    assert ds.manifest.class_counts == []
    assert ds.manifest.source["labels"] == "none"
    assert verify_dataset(out, progress=False).ok
    info = CliRunner().invoke(main, ["info", str(out)])
    assert info.exit_code == 0 and "unlabelled" in info.output


def test_the_cli_summary_says_the_records_are_unlabelled(listed, tmp_path):
    path = write_jsonl(listed.root / "u.jsonl", [{"path": p} for p, _, _ in listed.rows])
    result = CliRunner().invoke(main, ["pack", str(path), str(tmp_path / "u.tar")])
    assert result.exit_code == 0, result.output
    assert f"packed {len(listed.rows)} unlabelled images into" in result.stdout


def test_a_source_label_outside_its_classes_is_refused(tmp_path):
    class Bad:
        def __init__(self, classes, label):
            self.classes, self.label = classes, label

        def __len__(self):
            return 1

        def __iter__(self):
            yield SourceEntry("x.png", self.label, data=make_image_bytes(".png"))

        def describe(self):
            return {"root": None, "files": 1}

        def warnings(self):
            return []

    for classes, label, needle in ((["a"], 3, "not a class index"), ([], 0, "no classes"),
                                   (["a"], -1, "not a class index")):
        out = tmp_path / f"bad{label}.lmdb"
        with pytest.raises(FastDataError, match=needle):
            fastdata.pack(Bad(classes, label), out, progress=False)
        assert not out.exists()
    assert list_partials(tmp_path) == []


# -- Parquet -----------------------------------------------------------------------------


def test_hugging_face_parquet_takes_its_class_names_from_the_metadata(listed, tmp_path):
    path = listed.write("parquet")
    src = fastdata.open_source(path)
    assert type(src).__name__ == "ParquetSource"
    assert src.classes == HF_NAMES
    assert src.describe()["labels"] == "classlabel"
    entries = list(src)
    assert [e.data for e in entries] == listed.payloads
    assert [e.key for e in entries] == listed.keys
    assert [e.metadata for e in entries] == [{"note": f"note {i}"}
                                             for i in range(len(listed.rows))]
    out = tmp_path / "hf.h5"
    fastdata.pack(path, out, progress=False)
    got, ds = read_all(out)
    assert ds.classes == HF_NAMES
    assert [label for _, label in got] == listed.labels(HF_NAMES)


def test_parquet_without_classlabel_names_takes_integers(listed):
    path = write_hf_parquet(listed.root / "t.parquet",
                            [{"bytes": d, "path": None} for d in listed.payloads],
                            [i % 4 for i in range(len(listed.rows))], None)
    src = fastdata.open_source(path)
    assert src.classes == ["0", "1", "2", "3"]
    assert [e.label for e in src] == [i % 4 for i in range(len(listed.rows))]
    # No image path: keys by table and row.
    assert [e.key for e in src] == [f"t/{i:08d}" for i in range(len(listed.rows))]


def test_parquet_reads_the_file_when_the_bytes_are_not_embedded(listed, tmp_path):
    images = [{"bytes": None if i % 2 else d, "path": p}
              for i, (p, _, d) in enumerate(listed.rows)]
    path = write_hf_parquet(listed.root / "paths.parquet", images,
                            [HF_NAMES.index(c) for _, c, _ in listed.rows], HF_NAMES)
    entries = list(fastdata.open_source(path))
    assert entries[1].data is None and entries[1].path == str(listed.root / listed.keys[1])
    fastdata.pack(path, tmp_path / "p.tar", progress=False)
    assert read_all(tmp_path / "p.tar")[0] == list(zip(listed.payloads,
                                                       listed.labels(HF_NAMES)))


def test_a_folder_of_parquet_files_is_read_in_name_order(listed, tmp_path):
    folder = tmp_path / "hf" / "data"
    folder.mkdir(parents=True)
    half = len(listed.rows) // 2
    parts = {"train-00001-of-00002.parquet": listed.rows[half:],
             "train-00000-of-00002.parquet": listed.rows[:half]}
    for name, rows in parts.items():  # the later file written first
        write_hf_parquet(folder / name, [{"bytes": d, "path": None} for _, _, d in rows],
                         [HF_NAMES.index(c) for _, c, _ in rows], HF_NAMES)
    (folder / "README.md").write_text("not a table")
    assert fastdata.packers.sources.source_kind(folder) == "parquet"
    src = fastdata.open_source(folder)
    assert [e.data for e in src] == listed.payloads
    keys = [e.key for e in src]
    assert keys[0] == "train-00000-of-00002/00000000"
    assert keys[half] == "train-00001-of-00002/00000000"
    assert src.describe()["tables"] == sorted(parts)
    out = tmp_path / "folder.lmdb"
    fastdata.pack(folder, out, progress=False)
    assert read_all(out)[0] == list(zip(listed.payloads, listed.labels(HF_NAMES)))


def test_parquet_string_labels_and_unlabelled_tables(listed):
    images = [{"bytes": d, "path": None} for d in listed.payloads]
    table = pa.table({"image": pa.array(images, type=image_type()),
                      "label": pa.array([c for _, c, _ in listed.rows])})
    pq.write_table(table, listed.root / "names.parquet")
    src = fastdata.open_source(listed.root / "names.parquet")
    assert src.classes == ["ant", "cat", "dog"] and src.describe()["labels"] == "names"
    # -1 in every row: the datasets library's "no label" (a test split).
    path = write_hf_parquet(listed.root / "test.parquet", images, [-1] * len(images),
                            HF_NAMES)
    src = fastdata.open_source(path)
    assert src.classes == [] and {e.label for e in src} == {-1}
    path = write_hf_parquet(listed.root / "nolabel.parquet", images, None)
    assert fastdata.open_source(path).classes == []


def test_parquet_metadata_columns_become_json(listed):
    n = len(listed.rows)
    images = [{"bytes": d, "path": p} for p, _, d in listed.rows]
    objects = [{"bbox": [[float(i), 2.0, 3.0, 4.0]], "category": [i]} for i in range(n)]
    when = [datetime.datetime(2024, 1, 2, 3, 4, 5)] * n
    path = write_hf_parquet(listed.root / "m.parquet", images, [0] * n, HF_NAMES,
                            objects=objects, taken=when,
                            mask=[b"\x00\x01"] * n, caption=["c"] * n)
    src = fastdata.open_source(path)
    assert src.describe()["metadata_columns"] == ["objects", "taken", "caption"]
    assert any("'mask'" in w and "binary" in w for w in src.warnings())
    entry = list(src)[1]
    assert entry.metadata == {"objects": objects[1], "taken": "2024-01-02T03:04:05",
                              "caption": "c"}
    json.dumps(entry.metadata)  # JSON as it is


def test_parquet_paths_shared_by_rows_get_positional_keys(listed):
    d = listed.payloads
    images = [{"bytes": d[0], "path": "img.png"}, {"bytes": d[1], "path": "img.png"},
              {"bytes": d[2], "path": "other.png"}]
    path = write_hf_parquet(listed.root / "dup.parquet", images, [0, 1, 2], HF_NAMES)
    src = fastdata.open_source(path)
    assert [e.key for e in src] == ["img.png", "dup/00000001", "other.png"]
    assert any("1 row(s) have an image path an earlier row has" in w for w in src.warnings())


def test_a_parquet_table_larger_than_the_memory_allowed_packs_in_bounded_memory(tmp_path):
    """~200 MB of images in row groups of ~1.6 MB: the pack (run in a child, so
    its peak resident memory is its own) grows by far less than the table."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    images = []
    for _ in range(4):  # uncompressed PNGs of noise: ~200 KB each, no compression to win
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(
            buf, "PNG", compress_level=0)
        images.append(buf.getvalue())
    path = tmp_path / "big.parquet"
    schema = pa.schema([("image", image_type()), ("label", pa.int64())])
    rows, group = 1000, 8
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=False) as writer:
        for start in range(0, rows, group):
            batch = [{"bytes": images[i % 4], "path": f"{i}.png"}
                     for i in range(start, start + group)]
            writer.write_table(pa.table({"image": pa.array(batch, type=image_type()),
                                         "label": pa.array([i % 3 for i in range(group)],
                                                           type=pa.int64())},
                                        schema=schema))
    size = path.stat().st_size
    assert size > 190e6
    proc = run_python("""
        import json, resource, sys
        import fastdata
        from fastdata.packers.pack import PackOptions
        src = fastdata.open_source(sys.argv[1])
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        summary = fastdata.pack(src, sys.argv[2], options=PackOptions(workers=1),
                                progress=False)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"before": before, "after": after, "records": summary.records}))
        """, str(path), str(tmp_path / "big.tar"), timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["records"] == rows
    grown = result["after"] - result["before"]
    assert grown < size / 4, f"grew by {grown / 1e6:.0f} MB for a {size / 1e6:.0f} MB table"


# -- bad input ----------------------------------------------------------------------------


def bad_list(root: Path, case: str) -> tuple[Path, str]:
    """A list with one problem, and a phrase its error must contain."""
    img = root / "a.png"
    img.write_bytes(make_image_bytes(".png"))
    if case == "no-path-column":
        return write_csv(root / "l.csv", ["file", "label"], [["a.png", "x"]]), "no 'path' column"
    if case == "csv-field-count":
        path = root / "l.csv"
        path.write_text("path,label\na.png,x\nb.png,y,extra\n")
        return path, "line 3 has 3 field(s), the header 2"
    if case == "csv-quote":
        path = root / "l.tsv"
        path.write_text('path\tlabel\na.png\tx\n"b.png\t"y\n', encoding="utf-8")
        return path, "line 3"
    if case == "csv-not-utf8":
        path = root / "l.csv"
        path.write_bytes(b"path,label\na.png,x\nb\xff.png,y\n")
        return path, "line 3 is not UTF-8"
    if case == "jsonl-bad-json":
        path = root / "l.jsonl"
        path.write_text('{"path": "a.png", "label": "x"}\n\n{"path": "b.png", "label": }\n')
        return path, "line 3 is not valid JSON"
    if case == "jsonl-not-object":
        path = root / "l.jsonl"
        path.write_text('{"path": "a.png"}\n["b.png"]\n')
        return path, "line 2 holds a JSON list"
    if case == "jsonl-no-path":
        return write_jsonl(root / "l.jsonl", [{"path": "a.png"}, {"file": "b.png"}]), \
            "line 2 has no 'path' field"
    if case == "mixed-labels":
        return write_csv(root / "l.csv", ["path", "label"],
                         [["a.png", "cat"], ["b.png", "3"]]), "mixes class names and integers"
    if case == "jsonl-mixed-labels":
        return write_jsonl(root / "l.jsonl", [{"path": "a.png", "label": 1},
                                              {"path": "b.png", "label": "dog"}]), \
            "mixes class names and integers"
    if case == "jsonl-label-missing":
        return write_jsonl(root / "l.jsonl", [{"path": "a.png", "label": 1},
                                              {"path": "b.png"}]), "line 2: no label"
    if case == "negative-label":
        return write_csv(root / "l.csv", ["path", "label"], [["a.png", "-2"]]), \
            "line 2: label -2 is negative"
    if case == "empty-label":
        return write_csv(root / "l.csv", ["path", "label"], [["a.png", ""]]), \
            "line 2: the label ('label') is empty"
    if case == "no-rows":
        return write_csv(root / "l.csv", ["path", "label"], []), "the list has no rows"
    if case == "missing-list":
        return root / "nope.csv", "list file does not exist"
    if case == "parquet-not-parquet":
        path = root / "t.parquet"
        path.write_text("path,label\n")
        return path, "cannot read the Parquet table"
    if case == "parquet-no-image":
        pq.write_table(pa.table({"img": [b"x"], "label": [0]}), root / "t.parquet")
        return root / "t.parquet", "no image column 'image'"
    if case == "parquet-label-out-of-names":
        return write_hf_parquet(root / "t.parquet", [{"bytes": b"x", "path": None}] * 2,
                                [0, 5], ["a", "b"]), "t.parquet row 1: label 5 is not a class"
    raise AssertionError(case)


BAD_CASES = ["no-path-column", "csv-field-count", "csv-quote", "csv-not-utf8",
             "jsonl-bad-json", "jsonl-not-object", "jsonl-no-path", "mixed-labels",
             "jsonl-mixed-labels", "jsonl-label-missing", "negative-label", "empty-label",
             "no-rows", "missing-list", "parquet-not-parquet", "parquet-no-image",
             "parquet-label-out-of-names"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_lists_are_refused_with_their_file_and_line_before_anything_is_written(
        tmp_path, case):
    root = tmp_path / "in"
    root.mkdir()
    path, needle = bad_list(root, case)
    with pytest.raises(SourceError) as info:
        fastdata.open_source(path)
    assert needle in str(info.value) and str(path) in str(info.value)
    out = tmp_path / "out" / "x.lmdb"
    out.parent.mkdir()
    with pytest.raises(SourceError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        fastdata.pack(path, out, progress=False)
    assert os.listdir(out.parent) == []  # no output, no lock, no partial, no report
    result = CliRunner().invoke(main, ["pack", str(path), str(out)])
    assert_clean_cli_error(result, needle)
    assert os.listdir(out.parent) == []


def test_cli_messages_name_the_flags(tmp_path, listed):
    path = write_csv(listed.root / "f.csv", ["file"], [["a.png"]])
    result = CliRunner().invoke(main, ["pack", str(path), str(tmp_path / "x.lmdb")])
    assert_clean_cli_error(result, "--path-column NAME")
    tree = build_tree(tmp_path / "tree", ["a/x.png"])
    result = CliRunner().invoke(main, ["pack", str(tree.root), str(tmp_path / "y.lmdb"),
                                       "--label-column", "x"])
    assert_clean_cli_error(result, "--path-column and --label-column apply to list files")
    result = CliRunner().invoke(main, ["pack", str(listed.write("csv")),
                                       str(tmp_path / "z.lmdb"), "--extensions", "gif"])
    assert_clean_cli_error(result, "--extensions applies to an image folder")


def test_duplicate_paths_are_packed_once_and_reported(listed, tmp_path):
    rows = [[p, c] for p, c, _ in listed.rows]
    rows.insert(3, [listed.keys[0], "cat"])  # the same file again, with another label
    rows.append(["./" + listed.keys[1], listed.rows[1][1]])  # written another way
    path = write_csv(listed.root / "dups.csv", ["path", "label"], rows)
    src = fastdata.open_source(path)
    assert len(src) == len(listed.rows) and src.duplicates == 2
    (warning,) = src.warnings()
    assert "2 row(s) of dups.csv list a file an earlier row lists" in warning
    assert "lines 2 and 5" in warning and "1 of these rows give another label" in warning
    summary = fastdata.pack(path, tmp_path / "d.lmdb", progress=False)
    assert warning in summary.warnings
    assert read_all(tmp_path / "d.lmdb")[0] == list(zip(listed.payloads,
                                                        listed.labels(src.classes)))
    report = json.loads(Path(summary.report).read_text())
    assert warning in report["warnings"]


def test_a_listed_file_that_is_missing_or_unreadable_is_skipped_and_reported(listed,
                                                                             tmp_path):
    rows = [[p, c] for p, c, _ in listed.rows] + [["gone/missing.png", "cat"],
                                                  ["notes.png", "dog"]]
    (listed.root / "notes.png").write_text("not an image")
    path = write_csv(listed.root / "m.csv", ["path", "label"], rows)
    summary = fastdata.pack(path, tmp_path / "m.tar", progress=False)
    assert summary.records == len(listed.rows)
    skipped = {s.key: s.reason for s in summary.skipped}
    assert set(skipped) == {"gone/missing.png", "notes.png"}
    assert "cannot read file" in skipped["gone/missing.png"]
    report = json.loads(Path(summary.report).read_text())
    assert {s["key"] for s in report["skipped"]} == set(skipped)
    assert read_all(tmp_path / "m.tar")[0] == list(zip(listed.payloads,
                                                       listed.labels(["ant", "cat", "dog"])))
    with pytest.raises(BadImageError) as info:
        fastdata.pack(path, tmp_path / "strict.tar", options=PackOptions(strict=True),
                      progress=False)
    assert info.value.path == str(listed.root / "gone" / "missing.png")
    assert not (tmp_path / "strict.tar").exists()


# -- dispatch, shuffle, imports -------------------------------------------------------------


def test_open_source_picks_by_extension_and_folder_contents(listed, tmp_path):
    from fastdata.packers.sources import source_kind

    tree = build_tree(tmp_path / "tree", ["a/x.png", "b/y.png"])
    assert source_kind(tree.root) == "folder"
    assert type(fastdata.open_source(tree.root)).__name__ == "ImageFolderSource"
    upper = listed.write("tsv", name="UPPER")
    os.rename(upper, listed.root / "UPPER.TSV")
    src = fastdata.open_source(listed.root / "UPPER.TSV")
    assert src.describe()["kind"] == "tsv" and len(src) == len(listed.rows)
    assert source_kind(tmp_path / "x.ndjson") == "jsonl"
    assert source_kind(tmp_path / "x.png") == "folder"  # ImageFolderSource says what is wrong
    (tmp_path / "x.png").write_bytes(make_image_bytes(".png"))
    with pytest.raises(SourceError, match="not a folder .* nor a list"):
        fastdata.pack(tmp_path / "x.png", tmp_path / "o.lmdb", progress=False)


def test_a_list_source_shuffles_by_index(listed, tmp_path):
    path = listed.write("jsonl")
    a = fastdata.pack(path, tmp_path / "a.tar", options=PackOptions(shuffle=3),
                      progress=False)
    got, ds = read_all(a.output)
    expected = dict(zip(listed.keys, zip(listed.payloads, listed.labels(ds.classes))))
    assert sorted(ds.keys) == sorted(listed.keys) and ds.keys != listed.keys
    assert got == [expected[k] for k in ds.keys]


def test_output_beside_the_list_is_allowed(listed):
    out = listed.root / "beside.lmdb"
    fastdata.pack(listed.write("csv"), out, progress=False)
    assert len(fastdata.open_dataset(out)) == len(listed.rows)


def test_the_new_sources_import_nothing_third_party_until_a_table_is_opened():
    proc = run_python("""
        import json, sys
        before = set(sys.modules)
        import fastdata
        fastdata.CSVSource, fastdata.JSONLinesSource, fastdata.ParquetSource
        fastdata.open_source
        import fastdata.packers.sources
        new = {m.split(".")[0] for m in set(sys.modules) - before}
        print(json.dumps(sorted(new - set(sys.stdlib_module_names))))
        """, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["fastdata"]
