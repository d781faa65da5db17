"""``import fastdata`` stays light; heavy libraries load only when needed."""

from __future__ import annotations

import json

from conftest import run_python

HEAVY = ("torch", "lmdb", "h5py", "cv2", "PIL", "tensorflow", "simplejpeg")


def _loaded_after(statements: str) -> set[str]:
    code = f"""
        import json, sys
        {statements}
        print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
        """
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_import_fastdata_is_light():
    assert _loaded_after("import fastdata") == set()


def test_public_errors_and_registry_are_light():
    assert _loaded_after(
        "import fastdata; fastdata.FastDataError; fastdata.CorruptDataError; "
        "import fastdata.formats, fastdata.records, fastdata.errors; fastdata.__version__"
    ) == set()


def test_cli_module_is_light():
    # `fastdata --help` must not pay for torch.
    assert _loaded_after("import fastdata.cli") == set()


def test_dataset_access_imports_torch():
    loaded = _loaded_after("import fastdata; fastdata.LMDBDataset")
    assert "torch" in loaded


def test_pack_and_reader_do_not_need_torch():
    loaded = _loaded_after("import fastdata; fastdata.pack; fastdata.open_reader; "
                           "import fastdata.formats.lmdb.reader")
    assert "torch" not in loaded


def test_dir_lists_lazy_names():
    code = """
        import fastdata, sys
        names = dir(fastdata)
        assert "LMDBDataset" in names and "pack" in names and "open_dataset" in names, names
        assert "torch" not in sys.modules
        try:
            fastdata.no_such_name
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        else:
            raise SystemExit("no AttributeError")
        print("ok")
        """
    proc = run_python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
