"""fastdata's tar shards read by other tools with their defaults: webdataset's
``.decode("pil").to_tuple("jpg", "cls")``, Hugging Face ``datasets``'
``load_dataset("webdataset", ...)`` (class names from the manifest) and timm's
``create_dataset("wds/...")`` through the ``_info.json`` fastdata writes beside
the shards; and that file's upkeep (several splits in one folder, overwrite,
convert, a pack to a URL, two packs at once).

The source is ImageNet-like: JPEGs named ``.JPEG``, several classes and shards.
timm needs torchvision, which imports only beside the torch build it was made
for: its tests run in an interpreter that has both (this one, or
$FASTDATA_VISION_PYTHON, which .ci/run provides).
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import subprocess
from pathlib import Path

import numpy as np
import optional
import pytest
from ci_needs import checkout_env, vision_python
from click.testing import CliRunner
from PIL import Image

import fastdata
from fastdata import Decode
from fastdata.cli import main
from fastdata.errors import FastDataError
from fastdata.formats.tar.info import INFO_NAME, update_info

pytestmark = [pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*shardshuffle.*:UserWarning")]

def pack(src, out, **options):
    return fastdata.pack(src, out, options=fastdata.PackOptions(workers=1, **options),
                         progress=False)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """24 JPEGs named ``.JPEG`` in 3 classes, packed as two splits of one folder:
    ``train-%06d.tar`` (5 shards) and ``val-%06d.tar`` (3 shards)."""
    from fastdata.demo import synthesize

    root = tmp_path_factory.mktemp("interop")
    src = root / "src"
    synthesize(src, kind="photos", n=24, classes=3, progress=False)
    for path in sorted(src.rglob("*.jpg")):
        path.rename(path.with_suffix(".JPEG"))
    folder = root / "shards"
    train = pack(src, folder / "train-%06d.tar", shard_size=5)
    val = pack(src, folder / "val-%06d.tar", shard_size=10)
    return {"src": src, "folder": folder, "train": train, "val": val}


def expected(photos, split="train") -> list[tuple[str, bytes, int]]:
    """(key, file bytes, label) of every record in order; the label is the
    index of the key's class folder among the manifest's class names."""
    manifest = fastdata.formats.read_manifest(photos[split].output)
    keys = json.loads((photos["folder"] / f"{split}.tar.fastdata.keys.json").read_text())
    return [(key, (photos["src"] / key).read_bytes(), manifest.classes.index(key.split("/")[0]))
            for key in keys]


def shards(photos, split="train") -> list[str]:
    manifest = json.loads(Path(photos[split].output).read_text())
    return [str(photos["folder"] / s["path"]) for s in manifest["shards"]]


def pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def decoded(data: bytes) -> np.ndarray:
    return pixels(Image.open(io.BytesIO(data)))


# -- member names ------------------------------------------------------------------------


def test_jpeg_spellings_become_jpg_members_and_keys_stay_the_sources(photos):
    import tarfile

    want = expected(photos)
    assert all(key.endswith(".JPEG") for key, _, _ in want)
    names = []
    for shard in shards(photos):
        with tarfile.open(shard) as tar:
            names += tar.getnames()
    assert names == [f"{key[:-5]}.{ext}" for key, _, _ in want for ext in ("jpg", "cls")]
    ds = fastdata.open_dataset(photos["train"].output, decode=Decode(output="bytes"))
    assert ds.keys == [key for key, _, _ in want]
    assert [ds[i] for i in range(len(ds))] == [(data, label) for _, data, label in want]
    assert len(set(label for _, _, label in want)) == 3 and len(shards(photos)) == 5


# -- webdataset -------------------------------------------------------------------------


def test_webdataset_reads_every_sample_with_its_default_keys(photos):
    import webdataset as wds

    got = list(wds.WebDataset(shards(photos), shardshuffle=False).decode("pil")
               .to_tuple("jpg", "cls", "__key__"))
    want = expected(photos)
    assert [(key, label) for _, label, key in got] == [(k[:-5], lab) for k, _, lab in want]
    for (image, _, _), (_, data, _) in zip(got, want):
        assert np.array_equal(pixels(image), decoded(data))


# -- Hugging Face datasets --------------------------------------------------------------


def test_huggingface_datasets_reads_every_sample_and_the_manifest_names_the_classes(
        photos, tmp_path):
    datasets = optional.require("datasets")

    hf = datasets.load_dataset("webdataset", data_files={"train": shards(photos)},
                               split="train", cache_dir=str(tmp_path / "hf"))
    assert set(hf.column_names) == {"jpg", "cls", "__key__", "__url__"}
    classes = fastdata.formats.read_manifest(photos["train"].output).classes
    hf = hf.cast_column("cls", datasets.ClassLabel(names=classes))
    want = expected(photos)
    assert len(hf) == len(want)
    names = hf.features["cls"].names
    for row, (key, data, label) in zip(hf, want):
        assert (row["__key__"], row["cls"]) == (key[:-5], label)
        assert names[row["cls"]] == key.split("/")[0]
        assert np.array_equal(pixels(row["jpg"]), decoded(data))


# -- timm -----------------------------------------------------------------------------------


# timm runs in an interpreter that has it (maybe not this one: ci_needs.vision_python);
# what it read comes back as arrays in an .npz file (no pickle).
TIMM_READ = """
import sys
import numpy as np
from timm.data import create_dataset

folder, out = sys.argv[1:3]
arrays = {}
for split in ("train", "val"):
    ds = create_dataset("wds/photos", root=folder, split=split)
    got = list(ds)
    arrays[f"{split}_len"] = np.array([len(ds)])
    arrays[f"{split}_targets"] = np.array([int(t) for _, t in got])
    for i, (image, _) in enumerate(got):
        arrays[f"{split}_{i}"] = np.asarray(image.convert("RGB"))
# In training mode (shuffled) the sample count comes from _info.json too.
ds = create_dataset("wds/photos", root=folder, split="val", is_training=True, batch_size=4)
arrays["val_training_targets"] = np.array([int(t) for _, t in ds])
np.savez(out, **arrays)
"""

TIMM_TRANSFORMS = """
import sys
import json
import torch
import fastdata
from timm.data import create_transform

shards, out = sys.argv[1:3]
seen = []
for training in (False, True):
    ds = fastdata.open_dataset(shards, decode=fastdata.Decode(output="pil"),
                               transform=create_transform(224, is_training=training))
    image, label = ds[3]
    seen.append([str(image.dtype), list(image.shape), int(label)])
with open(out, "w") as f:
    json.dump(seen, f)
"""


def run_in_timm(code: str, *args) -> None:
    result = subprocess.run([vision_python(), "-c", code, *map(str, args)], env=checkout_env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def test_timm_create_dataset_reads_each_split_from_info_json(photos, tmp_path):
    run_in_timm(TIMM_READ, photos["folder"], tmp_path / "timm.npz")
    with np.load(tmp_path / "timm.npz", allow_pickle=False) as got:
        for split in ("train", "val"):
            want = expected(photos, split)
            assert int(got[f"{split}_len"][0]) == len(want)
            assert got[f"{split}_targets"].tolist() == [label for _, _, label in want]
            for i, (_, data, _) in enumerate(want):
                assert np.array_equal(got[f"{split}_{i}"], decoded(data)), (split, i)
        assert sorted(got["val_training_targets"].tolist()) == sorted(
            label for _, _, label in expected(photos, "val"))


def test_timm_transforms_on_fastdata_samples(photos, tmp_path):
    run_in_timm(TIMM_TRANSFORMS, photos["train"].output, tmp_path / "seen.json")
    label = expected(photos)[3][2]
    assert json.loads((tmp_path / "seen.json").read_text()) == [
        ["torch.float32", [3, 224, 224], label]] * 2


# -- _info.json -------------------------------------------------------------------------------


def test_info_json_lists_each_split_with_its_shards(photos):
    info = json.loads((photos["folder"] / INFO_NAME).read_text())
    for split in ("train", "val"):
        manifest = json.loads(Path(photos[split].output).read_text())
        assert info["splits"][split] == {
            "name": split, "num_samples": manifest["count"],
            "filenames": [s["path"] for s in manifest["shards"]],
            "shard_lengths": [s["count"] for s in manifest["shards"]]}
    assert set(info) == {"splits"} and set(info["splits"]) == {"train", "val"}
    for name in ("train-%06d.tar", "val.tar.fastdata.json"):  # fastdata's own tools ignore it
        for command in ("info", "verify"):
            result = invoke(command, photos["folder"] / name)
            assert result.exit_code == 0, result.output


def _info(folder) -> dict:
    return json.loads((Path(folder) / INFO_NAME).read_text())["splits"]


@pytest.fixture
def tiny(tmp_path):
    from fastdata.demo import synthesize

    synthesize(tmp_path / "src", kind="tiny", n=12, classes=2, progress=False)
    return tmp_path / "src"


def test_overwrite_under_another_split_name_replaces_the_entry(tiny, tmp_path):
    out = tmp_path / "out"
    pack(tiny, out / "data-%06d.tar", shard_size=5)
    pack(tiny, out / "other.tar")  # a single file is a split too: timm reads one shard
    assert _info(out)["data"]["filenames"] == [f"data-{n:06d}.tar" for n in range(3)]
    assert _info(out)["other"] == {"name": "other", "num_samples": 12,
                                   "filenames": ["other.tar"], "shard_lengths": [12]}
    pack(tiny, out / "data-%06d.tar", shard_size=4, overwrite=True,
         writer_options={"split": "train"})
    assert set(_info(out)) == {"other", "train"}  # "data" listed only this output's shards
    assert _info(out)["train"]["shard_lengths"] == [4, 4, 4]


def test_split_names_timm_cannot_look_up(tiny, tmp_path):
    with pytest.raises(FastDataError, match="shard pattern"):
        pack(tiny, tmp_path / "a" / "x.tar", writer_options={"split": "tarballs"})
    assert not (tmp_path / "a").exists() or not os.listdir(tmp_path / "a")
    pack(tiny, tmp_path / "b" / "guitars.tar")  # a default timm would misread: no entry
    assert not (tmp_path / "b" / INFO_NAME).exists()
    result = invoke("pack", tiny, tmp_path / "lmdb" / "x.lmdb", "--split", "train")
    assert result.exit_code == 1 and "split: not an option of lmdb outputs" in result.output


def test_a_foreign_info_file_is_refused_before_packing(tiny, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / INFO_NAME).write_text("[1, 2]")
    with pytest.raises(FastDataError, match="not a timm dataset info file") as info:
        pack(tiny, out / "train-%06d.tar", shard_size=5)
    assert info.value.path == str(out / INFO_NAME)
    assert sorted(os.listdir(out)) == [INFO_NAME]
    assert (out / INFO_NAME).read_text() == "[1, 2]"


def test_convert_to_tar_takes_the_split_and_the_source_spelling(photos, tmp_path):
    import tarfile

    out = tmp_path / "conv"
    result = invoke("convert", photos["train"].output, out / "part-%06d.tar", "--shard-size",
                    "12", "--split", "train", "--source-extensions", "--no-progress")
    assert result.exit_code == 0, result.output
    with tarfile.open(out / "part-000000.tar") as tar:
        assert tar.getnames()[0].endswith(".jpeg")  # IMG.JPEG, lower-cased
    assert _info(out)["train"]["filenames"] == ["part-000000.tar", "part-000001.tar"]
    manifest = json.loads((out / "part.tar.fastdata.json").read_text())
    assert manifest["pack_options"]["split"] == "train"
    assert manifest["pack_options"]["source_extensions"] is True
    ds = fastdata.open_dataset(out / "part.tar.fastdata.json", decode=Decode(output="bytes"))
    assert [ds[i] for i in range(len(ds))] == [(d, lab) for _, d, lab in expected(photos)]


def _update_many(folder: str, worker: int) -> None:
    for n in range(15):
        update_info(folder, f"w{worker}-{n}", [(f"w{worker}-{n}.tar", n)], owns=lambda _: False)


def test_packs_finishing_together_keep_every_split(tmp_path):
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_update_many, args=(str(tmp_path), w)) for w in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert set(_info(tmp_path)) == {f"w{w}-{n}" for w in range(2) for n in range(15)}
    assert sorted(os.listdir(tmp_path)) == [INFO_NAME]  # no lock or temporary file left


def test_a_pack_to_a_url_keeps_the_other_splits(tiny, tmp_path, s3_server, s3_env,
                                               monkeypatch):
    optional.require("obstore")
    from fastdata.storage import list_names, open_remote

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    s3_server.make_bucket("splits")
    pack(tiny, "s3://splits/ds/train-%06d.tar", shard_size=5)
    pack(tiny, "s3://splits/ds/val-%06d.tar", shard_size=6)
    info = json.loads(open_remote(f"s3://splits/ds/{INFO_NAME}").read())
    assert info["splits"]["train"]["shard_lengths"] == [5, 5, 2]
    assert info["splits"]["val"]["shard_lengths"] == [6, 6]
    pack(tiny, "s3://splits/ds/guitars.tar")  # no split of its own: the file stays as it is
    assert json.loads(open_remote(f"s3://splits/ds/{INFO_NAME}").read()) == info
    assert INFO_NAME in list_names("s3://splits/ds")
