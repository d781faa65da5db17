"""``fastdata bench``: it runs, reports every figure, and refuses rows that cheat.

No speed is ever asserted: these tests check the measurement's bookkeeping,
the output checks and the files it writes, on a few hundred 32x32 images.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from PIL import Image

import fastdata
from fastdata import bench as bm
from fastdata.cli import main
from fastdata.demo import synthesize
from fastdata.formats import FORMATS

ROW_FIELDS = {"name", "format", "variant", "label", "path", "workers", "status", "error", "cache",
              "decoder", "samples_per_s", "mb_per_s", "ratio", "pack_seconds", "size_bytes",
              "payload_bytes", "cpu", "other_cpu", "p50_ms", "p99_ms", "first_batch_ms",
              "samples", "batches", "epoch_samples_per_s", "epoch_seconds", "output_shape",
              "output_dtype"}
MACHINE_FIELDS = {"cpu_model", "usable_cores", "memory_total_bytes", "os", "python", "versions",
                  "fastdata_version"}
FIGURES = ("samples_per_s", "mb_per_s", "cpu", "p50_ms", "p99_ms")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench") / "tiny"
    synthesize(root, kind="tiny", n=48, classes=4, progress=False)
    return root


def _run(args, **kwargs):
    result = CliRunner().invoke(main, ["bench", *args], catch_exceptions=False, **kwargs)
    return result


def test_demo_tiny_writes_every_figure(tmp_path):
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    result = _run(["--demo", "tiny", "--limit", "200", "--epochs", "1", "--workers", "0",
                   "--batch-size", "32", "--json", str(out_json), "--plot", str(out_png),
                   "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "folder (PIL)" in result.stdout and "samples/s" in result.stdout
    assert "generated 200 32x32 PNGs in 10 classes (" in result.stderr, result.stderr

    data = json.loads(out_json.read_text())
    assert data["cache"] in ("warm", "cold")
    assert MACHINE_FIELDS <= set(data["machine"])
    assert {"torch", "numpy", "Pillow", "lmdb", "h5py", "fastdata"} <= set(
        data["machine"]["versions"])
    opts = data["options"]
    assert (opts["size"], opts["batch_size"], opts["workers"], opts["epochs"]) == (32, 32, [0], 1)
    assert opts["limit"] == 200

    rows = {r["name"]: r for r in data["rows"] if r["pipeline"] == "eval"}
    assert set(rows) == {"folder (PIL)", *FORMATS}  # the baseline and every format
    # Each packed format measured, then read once more by loader() as it
    # chooses and at the row's best worker count: the same float batches.
    defaults = {r["name"]: r for r in data["rows"] if r["pipeline"].startswith("defaults")}
    # Every format is measured here (a failed row would hide a broken format).
    assert {f: rows[f]["error"] for f in FORMATS if rows[f]["status"] != "ok"} == {}
    measured = list(FORMATS)
    assert set(defaults) == {f"{f} [loader()]" for f in measured} | \
        {f"{f} [loader(num_workers=0)]" for f in measured}
    for row in defaults.values():
        assert row["status"] == "ok", row["error"]
        assert row["output_dtype"] == "float32" and row["output_shape"] == [32, 3, 32, 32]
        assert row["samples"] == 200 and row["decode_path"]
    assert "no worker processes" in defaults["lmdb [loader()]"]["decode_path"]
    assert "defaults (open_dataset + fastdata.loader()" in result.stdout
    for row in rows.values():
        assert ROW_FIELDS <= set(row)
        assert row["cache"] == data["cache"] and row["workers"] == 0
        if row["status"] == "ok":
            assert all(isinstance(row[k], float) and row[k] >= 0 for k in FIGURES)
            assert row["samples"] == 200 and row["output_shape"] == [32, 3, 32, 32]
            assert row["output_dtype"] == "uint8" and row["error"] is None
        else:  # a format that cannot be packed or read is reported, never fatal
            assert row["status"] == "failed" and row["error"]
    base, lmdb = rows["folder (PIL)"], rows["lmdb"]
    assert base["status"] == "ok" and base["ratio"] == pytest.approx(1.0)
    assert base["pack_seconds"] is None and base["decoder"] == "pil"
    assert lmdb["status"] == "ok" and lmdb["ratio"] > 0
    assert lmdb["pack_seconds"] > 0 and lmdb["size_bytes"] > 0 and lmdb["payload_bytes"] > 0
    assert data["fastest"]["name"] in rows and "folder (PIL)" in data["best"]

    with Image.open(out_png) as img:
        img.load()
        assert img.format == "PNG" and img.width > 500


def test_existing_lmdb_and_limit(tiny_folder, tmp_path):
    path = tmp_path / "tiny.lmdb"
    fastdata.pack(tiny_folder, path, progress=False)
    out_json = tmp_path / "r.json"
    result = _run([str(path), "--epochs", "1", "--workers", "0", "--size", "16",
                   "--batch-size", "8", "--limit", "20", "--json", str(out_json),
                   "--no-progress"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out_json.read_text())["rows"]
    assert row["status"] == "ok", row["error"]
    assert row["format"] == "lmdb" and row["variant"] == "existing"
    assert row["samples"] == 20 and row["output_shape"] == [8, 3, 16, 16]
    assert row["pack_seconds"] is None and row["ratio"] is None  # no baseline in this run


def test_existing_folder_is_the_baseline(tiny_folder, tmp_path):
    lmdb_path = tmp_path / "t.lmdb"
    fastdata.pack(tiny_folder, lmdb_path, progress=False)
    result = _run([str(tiny_folder), str(lmdb_path), "--epochs", "1", "--workers", "0",
                   "--size", "8", "--json", "-", "--no-progress"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert rows[0]["format"] == "folder" and rows[0]["status"] == "ok"
    assert rows[1]["format"] == "lmdb" and rows[1]["status"] == "ok"


def _not_a_target(tmp_path, case: str) -> str:
    if case == "junk-file":
        (tmp_path / "junk.bin").write_bytes(b"nothing")
        return str(tmp_path / "junk.bin")
    if case == "empty-folder":
        (tmp_path / "empty").mkdir()
        return str(tmp_path / "empty")
    return str(tmp_path / {"missing": "nope", "missing-dataset": "nope.lmdb"}[case])


@pytest.mark.parametrize("alone", [True, False], ids=["alone", "with-a-folder"])
@pytest.mark.parametrize("case", ["missing", "missing-dataset", "junk-file", "empty-folder"])
def test_a_target_bench_cannot_measure_is_refused_up_front(tiny_folder, tmp_path, case, alone):
    target = _not_a_target(tmp_path, case)
    paths = [target] if alone else [str(tiny_folder), target]
    result = _run([*paths, "--epochs", "1", "--workers", "0", "--size", "8", "--no-progress"])
    assert result.exit_code == 1
    # One line naming the target and what bench takes: no header, no table of FAILED rows.
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {target}: "), result.output
    assert "fastdata bench measures image folders" in lines[0] and ".lmdb" in lines[0]
    assert "FAILED" not in result.output and result.stdout == ""


@pytest.mark.parametrize("args", [["--workers", "two"], ["--variants", "shrink"],
                                  ["--formats", "zip"], ["--epochs", "0"]])
def test_bad_options_are_one_line_errors(tiny_folder, args):
    result = CliRunner().invoke(main, ["bench", str(tiny_folder), *args])
    assert result.exit_code != 0
    assert "Traceback" not in result.output


def test_check_batch():
    good = (torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.arange(4))
    assert bm.check_batch(good, sample_shape=(3, 8, 8), batch_size=4) is None
    wrong_shape = (torch.zeros(4, 3, 8, 9, dtype=torch.uint8), torch.arange(4))
    assert "(4, 3, 8, 9)" in bm.check_batch(wrong_shape, sample_shape=(3, 8, 8))
    wrong_dtype = (torch.zeros(4, 3, 8, 8), torch.arange(4))
    assert "float32" in bm.check_batch(wrong_dtype, sample_shape=(3, 8, 8))
    assert "labels" in bm.check_batch((good[0], torch.arange(3)), sample_shape=(3, 8, 8))
    assert bm.check_batch(good, sample_shape=(3, 8, 8), batch_size=8) is not None
    assert "expected (images, labels)" in bm.check_batch(good[0], sample_shape=(3, 8, 8))


class _WrongSize(torch.utils.data.Dataset):
    """Decodes nothing and returns images of the wrong size."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.zeros(3, 5, 5, dtype=torch.uint8), 0


def test_row_with_wrong_output_is_marked_failed(tiny_folder, monkeypatch):
    baseline = bm.folder_target(tiny_folder)
    cheat = bm.Target(name="cheat", kind="packed", format="lmdb", variant="keep",
                      path="nowhere", count=10, payload_bytes=10)
    real_make = bm.loading.make_dataset
    monkeypatch.setattr(bm.loading, "make_dataset", lambda t, o: _WrongSize() if t.name == "cheat"
                        else real_make(t, o))
    report = bm.run_bench([baseline, cheat], bm.BenchOptions(size=8, epochs=1, workers=(0,)),
                          progress=False)
    by_name = {r.name: r for r in report.results}
    assert by_name["folder (PIL)"].ok
    bad = by_name["cheat"]
    assert bad.status == "failed" and bad.samples_per_s is None
    assert "wrong output" in bad.error and "(10, 3, 5, 5)" in bad.error
    assert "FAILED: MeasurementError: wrong output" in bm.format_table(report)
    assert report.fastest().name == "folder (PIL)"


def test_measure_loader_counts_and_refuses_missing_samples():
    batches = [(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.zeros(4, dtype=torch.long))] * 3
    calls = []
    m = bm.measure_loader(lambda: list(batches), epochs=2, warmup=1, payload_bytes=1000,
                          expected_samples=12, on_epoch=lambda: calls.append(1))
    assert len(calls) == 3 and m.samples == 12 and m.batches == 3
    assert len(m.epoch_seconds) == 2 and m.cache == "warm"
    assert m.output_shape == (4, 3, 2, 2) and m.output_dtype == "uint8"
    with pytest.raises(bm.MeasurementError, match="12 samples, expected 16"):
        bm.measure_loader(lambda: list(batches), epochs=1, expected_samples=16)


def test_cold_without_permission_runs_warm_and_says_so(tiny_folder, monkeypatch):
    monkeypatch.setattr(bm.measure, "drop_page_cache", lambda: "cannot drop the page cache (test)")
    lines = []
    report = bm.run_bench([bm.folder_target(tiny_folder)],
                          bm.BenchOptions(size=8, epochs=1, workers=(0,), cold=True),
                          progress=False, log=lines.append)
    assert report.cache == "warm" and report.results[0].cache == "warm"
    assert "running warm" in report.cache_note and any("running warm" in x for x in lines)


def test_parsers():
    assert bm.parse_workers("0, 1,2,2") == (0, 1, 2)
    names = [v.name for v in bm.parse_variants("keep,resize256,raw", 32)]
    assert names == ["keep", "resize256", "raw"]
    raw = bm.parse_variants("raw", 32)[0]
    assert raw.preprocess.resize == (32, 32) and raw.preprocess.encoding == "raw"
    assert raw.suffix == " raw (pre-decoded)"
    assert bm.parse_variants("resize64", 32)[0].preprocess.resize == 64
    assert bm.parse_formats(None) == tuple(FORMATS)
    assert bm.select_indices(10, 4, 0) == bm.select_indices(10, 4, 0)
    assert bm.select_indices(10, 20, 0) is None


class _FailsInWorker(torch.utils.data.Dataset):
    """Right output for a few samples, then an error raised inside a DataLoader worker."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        if i % 7 == 3:
            raise ValueError("broken sample")
        return torch.zeros(3, 8, 8, dtype=torch.uint8), 0


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="lists child processes in /proc")
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-epoch"])
def test_no_worker_process_outlives_its_row(tiny_folder, monkeypatch, persistent):
    baseline = bm.folder_target(tiny_folder)
    broken, after = (bm.Target(name=name, kind="packed", format="lmdb", variant="keep",
                               path="nowhere", count=48, payload_bytes=10)
                     for name in ("broken", "after"))
    before = set(bm.child_pids())
    leftover = {}

    def make(target, options):
        leftover[target.name] = set(bm.child_pids()) - before  # as the row starts
        if target.name == "broken":
            return _FailsInWorker()
        return bm.ImageFolderBaseline(baseline.samples, (8, 8))

    monkeypatch.setattr(bm.loading, "make_dataset", make)
    report = bm.run_bench([baseline, broken, after],
                          bm.BenchOptions(size=8, batch_size=8, epochs=1, workers=(2,),
                                          persistent_workers=persistent), progress=False)
    rows = [r for r in report.results if r.pipeline == "eval"]  # the defaults rows open "nowhere"
    assert [r.status for r in rows] == ["ok", "failed", "ok"]
    assert "ValueError" in rows[1].error and rows[0].cpu > 0
    assert leftover == {"folder (PIL)": set(), "broken": set(), "after": set()}
    assert set(bm.child_pids()) - before == set()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads child processes in /proc")
def test_children_cpu_counts_live_child_processes():
    spin = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
            "print('ready', flush=True)\ntime.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert proc.pid in bm.child_pids()
        assert bm.children_cpu_seconds() >= 0.25
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_limit_packs_exactly_the_baseline_samples(tiny_folder, tmp_path):
    targets = bm.pack_targets(tiny_folder, tmp_path, formats=("lmdb",),
                              variants=bm.parse_variants("keep", 8), limit=10, seed=3)
    base, packed = targets
    assert packed.error is None and base.count == packed.count == 10
    ds = fastdata.open_dataset(packed.path, decode=fastdata.Decode(output="bytes"))
    assert ds.keys == [os.path.relpath(p, tiny_folder).replace(os.sep, "/")
                       for p, _ in base.samples]
    assert ds.targets == [label for _, label in base.samples]
    assert ds.classes == sorted(os.listdir(tiny_folder))  # every class, even one not chosen
    assert ds.manifest.source["root"] == os.path.basename(tiny_folder)  # the folder itself
    assert not [n for n in os.listdir(tmp_path) if n.startswith("source")]  # no copied tree


def test_train_rows_compare_fused_with_unfused_best_against_best(tmp_path):
    from fastdata.decoding import turbojpeg

    out_json = tmp_path / "train.json"
    result = _run(["--demo", "--limit", "64", "--train", "--formats", "lmdb", "--workers", "0",
                   "--epochs", "1", "--size", "64", "--json", str(out_json), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "folder (PIL)" not in result.stdout  # --train replaces the evaluation rows
    assert "train fused / unfused, best against best" in result.stdout
    data = json.loads(out_json.read_text())
    assert data["options"]["train"] is True
    rows = {r["name"]: r for r in data["rows"]}
    assert set(rows) == {"lmdb train unfused", "lmdb train fused"}
    for row in rows.values():
        assert row["status"] == "ok", row["error"]
        assert row["samples_per_s"] > 0 and row["output_shape"] == [64, 3, 64, 64]
        assert row["pipeline"] == row["name"].removeprefix("lmdb ")
    assert rows["lmdb train unfused"]["decode_path"].startswith("full decode (")
    (summary,) = data["train"]
    assert summary["name"] == "lmdb" and summary["ratio_fused_to_unfused"] > 0
    assert summary["ratio_fused_to_unfused"] == pytest.approx(
        summary["fused"]["samples_per_s"] / summary["unfused"]["samples_per_s"])
    assert summary["fused_ran"] is turbojpeg.available()
    assert f"  lmdb: {summary['ratio_fused_to_unfused']:.2f}x (fused " in result.stdout
    if turbojpeg.available():
        assert "fused ran: TurboJPEG 3 crop-region decode" in result.stdout
    else:
        assert "TurboJPEG 3 is not installed" in result.stdout
        assert "not a fused measurement" in result.stdout


def test_train_fused_row_says_when_it_ran_the_unfused_path(tmp_path):
    # An explicit decoder turns the fused path off, with or without TurboJPEG.
    result = _run(["--demo", "--limit", "16", "--train", "--formats", "lmdb", "--workers", "0",
                   "--epochs", "1", "--size", "32", "--decoder", "pil", "--json", "-",
                   "--no-progress"])
    assert result.exit_code == 0, result.output
    (summary,) = json.loads(result.stdout)["train"]
    assert summary["fused_ran"] is False
    assert summary["fused_path"].endswith("fused needs --decoder auto")
    assert "not a fused measurement" in result.stderr  # the table, beside JSON on stdout


def test_train_refuses_only_image_folders(tiny_folder):
    result = CliRunner().invoke(main, ["bench", str(tiny_folder), "--no-pack", "--train"])
    assert result.exit_code != 0
    assert "--train measures packed datasets" in result.output


@pytest.mark.parametrize("workers", [0, 1])
def test_train_rows_crop_anew_every_epoch(tiny_folder, tmp_path, workers):
    # The factory sets the epoch before each epoch (persistent workers too):
    # each epoch crops differently, and a rerun repeats the crops exactly.
    packed = bm.pack_targets(tiny_folder, tmp_path, formats=("lmdb",),
                             variants=bm.parse_variants("keep", 8))[1]
    (_, fused) = bm.train_targets([packed])
    options = bm.BenchOptions(size=8, workers=(workers,), train=True, seed=5)

    def epoch_sums(epochs: int) -> list[int]:
        ds = bm.make_dataset(fused, options)
        factory = bm.loader_factory(ds, batch_size=48, workers=workers, seed=0)
        sums = [int(sum(images.sum() for images, _ in factory())) for _ in range(epochs)]
        factory.close()
        bm.close_dataset(ds)
        return sums

    first = epoch_sums(3)
    assert len(set(first)) == 3
    assert epoch_sums(2) == first[:2]


def test_jpeg_and_restart_variants():
    from fastdata.errors import FastDataError
    from fastdata.decoding import turbojpeg
    from fastdata.packers.preprocess import Preprocess

    jpeg, restarts = bm.parse_variants("jpeg90, JPEG90+restarts", 224)
    assert (jpeg.name, jpeg.preprocess) == ("jpeg90", Preprocess(encoding="jpeg", quality=90))
    assert restarts.name == "jpeg90+restarts" and restarts.suffix == " jpeg90+restarts"
    assert restarts.preprocess == Preprocess(encoding="jpeg", quality=90, restarts=True)
    if turbojpeg.restarts_supported():  # the original bytes, rewritten losslessly
        assert bm.parse_variants("keep+restarts", 224)[0].preprocess == Preprocess(restarts=True)
    else:
        with pytest.raises(FastDataError, match="libjpeg-turbo 3.1 or later"):
            bm.parse_variants("keep+restarts", 224)
    assert bm.parse_variants("resize256+restarts", 224)[0].preprocess == \
        Preprocess(resize=256, restarts=True)
    for bad, message in [("raw+restarts", "raw pixels have no JPEG restart markers"),
                         ("jpeg0", "quality of 1-100"), ("jpeg101", "quality of 1-100"),
                         ("keep+foo", r"the only suffix is \+restarts"),
                         ("jpeg", "unknown variant")]:
        with pytest.raises(FastDataError, match=message):
            bm.parse_variants(bad, 224)


def _train_report(rows) -> bm.BenchReport:
    """A report of training rows: (dataset, pipeline, workers, samples/s, decode path)."""
    from fastdata.bench.results import Result

    results = [Result(name=f"{base} {pipeline}", format="lmdb", variant="keep", label=base,
                      path=None, workers=workers, status="ok", error=None, cache="warm",
                      decoder="auto", samples_per_s=rate, pipeline=pipeline, decode_path=path)
               for base, pipeline, workers, rate, path in rows]
    return bm.BenchReport(machine={}, options={}, cache="warm", cache_note=None,
                          results=results, seconds=1.0, created_at="now")


def test_train_summary_compares_the_best_fused_with_the_best_unfused_dataset():
    from fastdata.bench.results import best_of_all
    from fastdata.bench.train import RESTARTS_HINT, train_lines
    from fastdata.decoding.fused_crop import FUSED_CUT, FUSED_REGION

    full = "full decode (simplejpeg, jpeg), then crop, resize, flip"
    rows = [("lmdb", "train unfused", 0, 100.0, full), ("lmdb", "train unfused", 2, 150.0, full),
            ("lmdb", "train fused", 2, 180.0, FUSED_REGION),
            ("lmdb jpeg90+restarts", "train unfused", 2, 120.0, full),
            ("lmdb jpeg90+restarts", "train fused", 0, 90.0, FUSED_CUT),
            ("lmdb jpeg90+restarts", "train fused", 2, 300.0, FUSED_CUT),
            # A fused row that ran the whole-image decode is no fused measurement.
            ("lmdb raw", "train unfused", 2, 140.0, full),
            ("lmdb raw", "train fused", 2, 900.0, f"{full}: the records are not JPEGs")]
    report = _train_report(rows)
    overall = best_of_all(report)
    assert overall == {"ratio": 2.0, "fused": "lmdb jpeg90+restarts at 2 workers",
                       "fused_rate": 300.0, "unfused": "lmdb at 2 workers",
                       "unfused_rate": 150.0}
    lines = train_lines(report)
    assert lines[-1] == ("best fused / best unfused over all datasets: 2.00x (lmdb "
                         "jpeg90+restarts at 2 workers 300 samples/s / lmdb at 2 workers 150)")
    assert f"    fused ran: {FUSED_CUT}" in lines
    assert RESTARTS_HINT not in lines  # restart-marked rows were measured
    assert report.to_dict()["train_best"] == overall
    # One dataset: nothing to compare across.
    single = _train_report(rows[:3])
    assert best_of_all(single) is None
    assert not any(line.startswith("best fused") for line in train_lines(single))
    assert "train_best" not in single.to_dict()
    # Region decoding only: the summary says how to decode only the crop's bytes.
    assert train_lines(single)[-1] == RESTARTS_HINT
