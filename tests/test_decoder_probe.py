"""A decoder that imports but cannot decode is not offered, and says why, quietly.

jpeg4py without libturbojpeg is the case met: its JPEG object fails in
``__init__`` and its ``__del__`` then raises when collected, which Python
printed as "Exception ignored in ..." at the probe, in every DataLoader worker
and at exit. Each test runs a child interpreter and reads its stderr whole.
``broken`` (tests/broken_decoder.py) fails the same way without jpeg4py;
``jpeg4py`` is the real library pointed at a libturbojpeg that does not exist.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import optional
import pytest
from PIL import Image

import fastdata
from ci_needs import checkout_env
from fastdata.decoding import decode as D
from fastdata.errors import FastDataError

TESTS = os.path.dirname(os.path.abspath(__file__))
KINDS = ["broken", "jpeg4py"]
REASONS = {"broken": "OSError: libbroken.so.0: cannot open shared object file",
           "jpeg4py": "jpeg4py imports but libturbojpeg cannot be loaded: "
                      "Could not load libjpeg-turbo library"}

# Probes in this process, reads with auto in it and in DataLoader workers
# (fork and spawn; each worker probes anew), asks for the decoder by name, and
# collects garbage before exit: whatever the probe left must make no noise.
READ = """
import functools, gc, sys
import torch
import fastdata, broken_decoder
from fastdata.decoding import decode as D
from fastdata.errors import FastDataError

kind, path = sys.argv[1:]
name = broken_decoder.setup(kind)
if __name__ == "__main__":
    print("reason:", D.decoder_status()[name])
    print("auto:", ",".join(d.name for d in D.DecoderChain("auto")._chain("jpeg")))
    image, _ = fastdata.open_dataset(path, decode=fastdata.Decode(size=(16, 16)))[0]
    print("read:", tuple(image.shape))
    try:
        fastdata.Decode(decoder=name)
    except FastDataError as exc:
        print("by name:", exc)
    for context in ("fork", "spawn"):
        D._unusable.clear()  # forked workers probe again too
        ds = fastdata.open_dataset(path, decode=fastdata.Decode(size=(16, 16)))
        loader = torch.utils.data.DataLoader(
            ds, batch_size=4, num_workers=2, multiprocessing_context=context,
            worker_init_fn=functools.partial(broken_decoder.worker_init, kind),
            collate_fn=fastdata.collate)
        print(context + ":", sum(len(labels) for _, labels in loader))
    gc.collect()
"""

# `fastdata info` and `fastdata bench --json -` with the decoder unusable.
CLI = """
import sys
import broken_decoder
broken_decoder.setup(sys.argv.pop(1))
from fastdata.cli import main
main()
"""


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """An LMDB of 8 small JPEGs in 2 classes."""
    root = tmp_path_factory.mktemp("probe")
    for i in range(8):
        folder = root / "images" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (32, 24), (30 * i, 90, 200 - 20 * i)).save(folder / f"{i}.jpg")
    out = root / "ds.lmdb"
    fastdata.pack(root / "images", out, progress=False)
    return out


def _child(script: str, *args, tmp_path) -> subprocess.CompletedProcess:
    env = checkout_env()
    env["PYTHONPATH"] = os.pathsep.join([TESTS, env["PYTHONPATH"]])
    env["PROBE_LOG"] = str(tmp_path / "probes.log")
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)


def _needs(kind: str) -> None:
    if kind == "jpeg4py":
        optional.skip_if_missing("jpeg4py")


@pytest.mark.parametrize("kind", KINDS)
def test_an_unusable_decoder_is_skipped_without_a_word(kind, packed, tmp_path):
    _needs(kind)
    result = _child(READ, kind, packed, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no "Exception ignored", no traceback, at any point
    out = result.stdout
    assert f"reason: {REASONS[kind]}\n" in out
    auto = out.split("auto: ", 1)[1].splitlines()[0].split(",")
    assert kind not in auto and auto[-1] == "pil"
    assert "read: (3, 16, 16)" in out and "fork: 8\n" in out and "spawn: 8\n" in out
    assert (f"by name: decoder {kind!r} is installed but cannot be used here: "
            f"{REASONS[kind]}; it needs pip install ") in out
    # The main process and each of the 2 + 2 workers probed it, once.
    pids = (tmp_path / "probes.log").read_text().split()
    assert len(pids) == len(set(pids)) == 5, pids


@pytest.mark.parametrize("kind", KINDS)
def test_info_and_bench_say_why_a_decoder_is_not_offered(kind, packed, tmp_path):
    _needs(kind)
    said = f"{kind} ({REASONS[kind]})"  # after "not offered: ", maybe beside others
    info = _child(CLI, kind, "info", packed, tmp_path=tmp_path)
    assert info.returncode == 0 and info.stderr == "", info.stderr
    decoders = [t for t in info.stdout.splitlines() if t.startswith("  decoders ")]
    assert len(decoders) == 1, info.stdout
    offered, not_offered = decoders[0].split("; not offered: ")
    assert said in not_offered and "pil" in offered and kind not in offered

    bench = _child(CLI, kind, "bench", packed, "--workers", "0", "--epochs", "1",
                   "--batch-size", "4", "--size", "16", "--no-progress", "--json", "-",
                   tmp_path=tmp_path)
    assert bench.returncode == 0, bench.stderr
    assert "Exception ignored" not in bench.stderr and "Traceback" not in bench.stderr
    table = [t for t in bench.stderr.splitlines() if t.startswith("decoders: ")]
    assert len(table) == 1 and said in table[0].split("; not offered: ")[1], bench.stderr
    decoders = json.loads(bench.stdout)["machine"]["decoders"]
    assert decoders["not_offered"][kind] == REASONS[kind]
    assert kind not in decoders["offered"] and "pil" in decoders["offered"]


def test_names_unknown_and_not_installed_decoders(monkeypatch):
    monkeypatch.setitem(D._unusable, "jpeg4py", "not installed")
    with pytest.raises(FastDataError, match=r"decoder 'jpeg4py' is not installed: "
                                            r"pip install jpeg4py"):
        D.DecoderChain("jpeg4py")
    status = D.decoder_status()
    assert status["jpeg4py"] == "not installed" and status["pil"] is None
    assert "not offered: jpeg4py (not installed)" in D.decoder_status_line(status)
