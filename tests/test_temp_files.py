"""Files written whole through a temporary name (a view file, a pack's
report, a bench result, timm's ``_info.json``) never follow a link planted
at a temporary name: the temporary file is made new (exclusive create) under
a random name beside the target, then renamed over it.

Each test plants a symbolic link at the name such a write used before
(``PATH.tmp-<pid>``, ``PATH.partial``, ``.NAME.fastdata-tmp``) pointing at a
file outside the folder, and checks that the file outside is unchanged
and the target holds the new bytes.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from conftest import no_hang

from fastdata.storage.partial import partial_file, replace_file


@pytest.fixture(autouse=True)
def _time_limit():
    with no_hang(60):
        yield


@pytest.fixture
def outside(tmp_path):
    """A file outside the folder written to, and a check that it is unchanged."""
    victim = tmp_path / "elsewhere" / "precious.txt"
    victim.parent.mkdir()
    victim.write_text("precious\n")
    yield victim
    assert victim.read_text() == "precious\n", "the write followed the planted link"
    assert not victim.is_symlink()


def _plant(link, target) -> None:
    os.symlink(target, link)


def _json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_a_view_file_write_does_not_follow_a_link_at_its_old_temporary_name(tmp_path,
                                                                            outside):
    import fastdata
    from fastdata.demo import synthesize

    synthesize(tmp_path / "src", kind="tiny", n=20, seed=1)
    parent = fastdata.pack(tmp_path / "src", tmp_path / "data" / "d.lmdb",
                           progress=False).output
    view = tmp_path / "v.fastdata.json"
    link = f"{view}.tmp-{os.getpid()}"
    _plant(link, outside)
    result = fastdata.subset(parent, view, fraction=0.5, progress=False)
    assert len(fastdata.open_dataset(view)) == result.records == 10
    assert os.path.islink(link)  # left alone, not written through
    assert not [n for n in os.listdir(tmp_path) if ".partial-" in n]


def test_a_pack_report_does_not_follow_a_link_at_its_old_temporary_name(tmp_path, outside):
    from fastdata.packers.summary import report_path, write_report

    output = str(tmp_path / "out.lmdb")
    _plant(f"{report_path(output)}.partial", outside)
    path = write_report(output, [], ["a warning"], [])
    assert _json(path)["warnings"] == ["a warning"]


def test_a_bench_result_does_not_follow_a_link_at_its_old_temporary_name(tmp_path, outside):
    from fastdata.bench.report import write_json
    from fastdata.bench.results import BenchReport

    path = str(tmp_path / "bench.json")
    _plant(f"{path}.partial", outside)
    report = BenchReport(machine={"cores": 2}, options={}, cache="warm", cache_note=None,
                         results=[], seconds=1.0, created_at="now")
    write_json(report, path)
    assert _json(path)["cache"] == "warm"


def test_timm_info_does_not_follow_a_link_at_its_old_temporary_name(tmp_path, outside):
    from fastdata.formats.tar.info import INFO_NAME, update_info

    folder = tmp_path / "tars"
    folder.mkdir()
    _plant(folder / f".{INFO_NAME}.fastdata-tmp", outside)
    path = update_info(str(folder), "train", [("train-000000.tar", 5)],
                       owns=lambda name: name.startswith("train-"))
    info = _json(path)
    assert info["splits"]["train"]["num_samples"] == 5
    # What a killed update left behind is gone, the planted link included.
    assert os.listdir(folder) == [INFO_NAME]


# -- the helper itself ----------------------------------------------------------------


def test_replace_file_replaces_a_link_at_the_target_never_writing_through_it(tmp_path,
                                                                             outside):
    dest = tmp_path / "out.json"
    _plant(dest, outside)
    replace_file(str(dest), b"new\n")
    assert not dest.is_symlink() and dest.read_bytes() == b"new\n"
    replace_file(str(dest), "again\n")
    assert dest.read_text() == "again\n"
    assert sorted(os.listdir(tmp_path)) == ["elsewhere", "out.json"]


def test_replace_file_gives_the_usual_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        replace_file(str(tmp_path / "a.json"), b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode) == 0o644


def test_partial_files_are_new_and_randomly_named(tmp_path):
    dest = str(tmp_path / "x.bin")
    made = []
    for _ in range(20):
        fd, name = partial_file(dest)
        os.close(fd)
        made.append(name)
    assert len(set(made)) == 20
    assert all(os.path.dirname(n) == str(tmp_path) and
               os.path.basename(n).startswith("x.bin.partial-") for n in made)


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    class Broken:
        def __len__(self):
            return 3

    with pytest.raises(TypeError):
        replace_file(str(tmp_path / "x.bin"), Broken())
    assert os.listdir(tmp_path) == []
