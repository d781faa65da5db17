"""ImageFolderSource: classes, labels and sample order as torchvision's ImageFolder has them."""

from __future__ import annotations

import os

import pytest
from conftest import (
    DEFAULT_CLASSES,
    DEFAULT_KEYS,
    DEFAULT_SPEC,
    IMAGE_FILE_EXTENSIONS,
    IMG_EXTENSIONS,
    build_tree,
    make_image_bytes,
    torchvision_classes,
    torchvision_samples,
)

from fastdata.encodings import TORCHVISION_EXTENSIONS
from fastdata.errors import FastDataError, SourceError
from fastdata.packers.source import (
    IGNORED_EXTENSION,
    ImageFolderSource,
    parse_extensions,
)


def _entries(src: ImageFolderSource) -> list[tuple[str, int]]:
    return [(e.key, e.label) for e in src]


def test_reimplementation_sanity(image_tree):
    # The hand-written expectations and the re-implemented torchvision walk agree.
    assert image_tree.classes == DEFAULT_CLASSES
    assert image_tree.keys == DEFAULT_KEYS


def test_classes_and_labels_match_torchvision(image_tree):
    src = ImageFolderSource(image_tree.root)
    assert src.classes == torchvision_classes(image_tree.root) == DEFAULT_CLASSES
    assert src.class_to_idx == {c: i for i, c in enumerate(DEFAULT_CLASSES)}
    assert _entries(src) == [(s.key, s.label) for s in image_tree.samples]
    assert (image_tree.root / "b_cls/nested/b3.gif").is_file()  # torchvision skips it
    assert "b_cls/nested/b3.gif" not in {e.key for e in src}
    assert len(src) == len(image_tree.samples)
    for entry, sample in zip(src, image_tree.samples):
        assert os.path.isabs(entry.path)
        with open(entry.path, "rb") as f:
            assert f.read() == sample.data
        assert entry.key == os.path.relpath(entry.path, src.root).replace(os.sep, "/")


def test_root_given_relative_and_as_pathlike(image_tree, monkeypatch):
    monkeypatch.chdir(image_tree.root.parent)
    a = ImageFolderSource("src")
    b = ImageFolderSource(image_tree.root)
    assert a.root == b.root == str(image_tree.root)
    assert _entries(a) == _entries(b)


def test_recursive_order_is_by_directory_path_then_name(image_tree):
    keys = [e.key for e in ImageFolderSource(image_tree.root) if e.label == 0]
    # Sorted by full directory path: "sub" < "sub-x" < "sub/deep" ('-' < '/'),
    # which is not a depth-first order.
    assert keys == ["A_cls/IMG1.JPEG", "A_cls/img0.jpg", "A_cls/sub/z.webp",
                    "A_cls/sub-x/y.bmp", "A_cls/sub/deep/x.png"]
    assert "b_cls/nested/more/b5.pgm" in DEFAULT_KEYS


def test_case_insensitive_extensions(image_tree):
    keys = {e.key for e in ImageFolderSource(image_tree.root)}
    for key in ("A_cls/IMG1.JPEG", "b_cls/b0.Png", "b_cls/B4.TIFF", "c2/x.PPM"):
        assert key in keys


def test_reimplementation_uses_torchvisions_extensions():
    # Written out in conftest, never taken from fastdata; fastdata's default is the same.
    assert IMG_EXTENSIONS == (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff",
                              ".webp")
    assert set(TORCHVISION_EXTENSIONS) == set(IMG_EXTENSIONS)


def test_every_torchvision_extension_is_found_and_gif_is_not(tmp_path):
    exts = [".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".pgm", ".tif", ".tiff", ".gif"]
    spec = [f"k/f{i}{e.upper() if i % 2 else e}" for i, e in enumerate(exts)]
    tree = build_tree(tmp_path / "src", spec)
    src = ImageFolderSource(tree.root)
    assert len(src) == len(exts) - 1 == len(tree.samples)
    assert [e.key for e in src] == tree.keys
    assert [(i.key, i.reason) for i in src.ignored] == [("k/f9.GIF", IGNORED_EXTENSION)]
    assert src.describe()["ignored_extensions"] == {"gif": 1}


def test_gif_among_images_keeps_torchvisions_samples_and_indices(tmp_path):
    # 34 images and one GIF in the middle of a class: were the GIF a sample,
    # every index after it would point at the next image.
    spec = [f"a/img{i:02d}.png" for i in range(17)] + ["a/img08b.gif"] + [
        f"b/img{i:02d}.jpg" for i in range(17)]
    tree = build_tree(tmp_path / "src", spec)
    assert len(tree.samples) == 34
    src = ImageFolderSource(tree.root)
    assert len(src) == 34
    assert _entries(src) == [(s.key, s.label) for s in tree.samples]
    assert src.class_to_idx == {"a": 0, "b": 1}
    for i, (entry, sample) in enumerate(zip(src, tree.samples)):
        with open(entry.path, "rb") as f:
            assert f.read() == sample.data, i
    # The packed dataset: the same samples at the same indices.
    import fastdata

    fastdata.pack(tree.root, tmp_path / "out.lmdb", progress=False)
    ds = fastdata.open_dataset(tmp_path / "out.lmdb", decode=fastdata.Decode(output="bytes"))
    assert ds.keys == tree.keys
    assert [ds[i] for i in range(len(ds))] == [(s.data, s.label) for s in tree.samples]


def test_extensions_add_gif(tmp_path):
    spec = ["a/x.png", "a/y.gif", "a/z.GIF", "b/w.jpg", "b/v.txt"]
    build_tree(tmp_path / "src", spec)
    with_gif = torchvision_samples(tmp_path / "src", IMAGE_FILE_EXTENSIONS)
    for extensions in ("+gif", "+.GIF", [*IMG_EXTENSIONS, "gif"]):
        src = ImageFolderSource(tmp_path / "src", extensions=extensions)
        assert _entries(src) == [(s.key, s.label) for s in with_gif], extensions
        assert src.describe()["extensions"] == [e[1:] for e in IMAGE_FILE_EXTENSIONS]
        assert src.describe()["ignored_extensions"] == {"txt": 1}
    only = ImageFolderSource(tmp_path / "src", extensions="gif")
    assert [e.key for e in only] == ["a/y.gif", "a/z.GIF"]
    assert only.describe()["ignored_extensions"] == {"jpg": 1, "png": 1, "txt": 1}
    sub = ImageFolderSource(tmp_path / "src", extensions="+gif").subset([3])
    assert sub.extensions == IMAGE_FILE_EXTENSIONS and [e.key for e in sub] == ["b/w.jpg"]


def test_parse_extensions():
    assert parse_extensions(None) == TORCHVISION_EXTENSIONS
    assert parse_extensions(" GIF, .jpg ,gif") == (".gif", ".jpg")
    assert parse_extensions(["png"]) == (".png",)
    assert parse_extensions("+gif,png") == TORCHVISION_EXTENSIONS + (".gif",)
    for bad in ("", "+", "gif,,jpg", "a/b", ".", ["gif", 3], "x y"):
        with pytest.raises(FastDataError, match="extensions="):
            parse_extensions(bad)


def test_no_image_error_names_the_extensions(tmp_path):
    build_tree(tmp_path / "src", ["a/only.gif"])
    with pytest.raises(SourceError, match=r"jpg jpeg png ppm bmp pgm tif tiff webp \(extensions="):
        ImageFolderSource(tmp_path / "src")
    assert len(ImageFolderSource(tmp_path / "src", extensions="+gif")) == 1


def test_hidden_and_non_images_are_ignored_and_counted(image_tree):
    src = ImageFolderSource(image_tree.root)
    keys = [e.key for e in src]
    assert not any(part.startswith(".") for k in keys for part in k.split("/"))
    assert not any(k.endswith((".txt", ".db")) for k in keys)
    assert ".hidden_cls" not in src.classes
    ignored = {i.key: i.reason for i in src.ignored}
    assert ignored == {
        ".hidden_cls": "hidden",
        ".DS_Store": "hidden",
        "README.txt": "file outside any class folder",
        "A_cls/.hid_dir": "hidden",
        "A_cls/.hidden.jpg": "hidden",
        "A_cls/notes.txt": IGNORED_EXTENSION,
        "b_cls/nested/b3.gif": IGNORED_EXTENSION,
        "c10/thumbs.db": IGNORED_EXTENSION,
    }


def test_empty_class_keeps_its_label(image_tree):
    src = ImageFolderSource(image_tree.root)
    assert src.empty_classes == ["z_empty"]
    assert src.class_to_idx["z_empty"] == 4
    assert src.classes[-1] == "z_empty"
    assert 4 not in {e.label for e in src}


def test_class_with_only_non_images_is_empty(tmp_path):
    build_tree(tmp_path / "src", ["a/x.png", "b/readme.txt", "c/.hidden.png", "d/y.jpg"])
    src = ImageFolderSource(tmp_path / "src")
    assert src.classes == ["a", "b", "c", "d"]
    assert src.empty_classes == ["b", "c"]
    assert _entries(src) == [("a/x.png", 0), ("d/y.jpg", 3)]


@pytest.mark.parametrize("order", ["sorted", "reverse", "random"])
def test_order_does_not_depend_on_creation_order(tmp_path, order):
    tree = build_tree(tmp_path / "src", DEFAULT_SPEC, order=order)
    src = ImageFolderSource(tree.root)
    assert src.classes == DEFAULT_CLASSES
    assert [e.key for e in src] == DEFAULT_KEYS
    assert _entries(src) == [(s.key, s.label) for s in tree.samples]


def test_same_result_for_differently_created_trees(tmp_path):
    a = build_tree(tmp_path / "a", DEFAULT_SPEC, order="sorted")
    b = build_tree(tmp_path / "b", DEFAULT_SPEC, order="random", seed=0)
    assert _entries(ImageFolderSource(a.root)) == _entries(ImageFolderSource(b.root))
    assert a.samples == b.samples  # same spec + seed: the same bytes too


def test_many_files_in_scrambled_creation_order(tmp_path):
    import random

    names = [f"{i:03d}.png" for i in range(60)] + [f"N{i}.jpg" for i in range(10)]
    random.Random(7).shuffle(names)
    root = tmp_path / "src"
    for j, name in enumerate(names):
        cls = ("b", "a", "C")[j % 3]
        (root / cls).mkdir(parents=True, exist_ok=True)
        (root / cls / name).write_bytes(make_image_bytes(os.path.splitext(name)[1], name=name))
    src = ImageFolderSource(root)
    assert _entries(src) == [(s.key, s.label) for s in torchvision_samples(root)]
    assert src.classes == ["C", "a", "b"]


def test_symlinked_folder_is_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o.png").write_bytes(make_image_bytes(".png", name="o"))
    tree_root = tmp_path / "src"
    build_tree(tree_root, ["k/a.png", "k/zz/b.png"])
    os.symlink(outside, tree_root / "k" / "linked")
    src = ImageFolderSource(tree_root)
    assert [e.key for e in src] == [s.key for s in torchvision_samples(tree_root)]
    assert "k/linked/o.png" in [e.key for e in src]


def test_symlink_loop_terminates(tmp_path):
    root = tmp_path / "src"
    build_tree(root, ["k/a.png", "k/sub/b.png"])
    os.symlink("..", root / "k" / "sub" / "up")  # k/sub/up -> k
    src = ImageFolderSource(root)
    keys = [e.key for e in src]
    assert keys.count("k/a.png") == 1 and keys.count("k/sub/b.png") == 1
    assert len(keys) == len(set(keys))


# -- errors -----------------------------------------------------------------------


def test_missing_folder(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(SourceError, match="does not exist") as info:
        ImageFolderSource(missing)
    assert info.value.path == str(missing)
    assert str(missing) in str(info.value)


def test_file_instead_of_folder(tmp_path):
    f = tmp_path / "file.png"
    f.write_bytes(make_image_bytes(".png"))
    with pytest.raises(SourceError, match="not a folder") as info:
        ImageFolderSource(f)
    assert info.value.path == str(f)


@pytest.mark.parametrize("spec", [
    [],                                  # an empty folder
    ["a.png", "b.jpg", "notes.txt"],     # images but no class folders
    [".hidden/a.png", ".git/x.png"],     # only hidden folders
], ids=["empty", "files-only", "hidden-only"])
def test_no_class_folders(tmp_path, spec):
    root = tmp_path / "src"
    build_tree(root, spec)
    with pytest.raises(SourceError, match="no class folders") as info:
        ImageFolderSource(root)
    assert info.value.path == str(root)


@pytest.mark.parametrize("spec", [
    ["a/", "b/"],
    ["a/readme.txt", "b/sub/", "b/.hidden.png", "c/data.csv"],
], ids=["empty-classes", "non-images"])
def test_class_folders_without_images(tmp_path, spec):
    root = tmp_path / "src"
    build_tree(root, spec)
    with pytest.raises(SourceError, match="no image files") as info:
        ImageFolderSource(root)
    assert isinstance(info.value, FastDataError)
    assert info.value.path == str(root)


# -- the Source protocol -------------------------------------------------------


class _MemorySource:
    """A Source that holds its images in memory (bytes, no files)."""

    def __init__(self, items, classes):
        self.items = items
        self.classes = classes

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        from fastdata.packers.source import SourceEntry

        return (SourceEntry(key, label, data=data) for key, label, data in self.items)

    def describe(self):
        return {"root": None, "files": len(self.items), "kind": "memory"}

    def warnings(self):
        return ["a word from the source"]


def test_pack_takes_any_source(tmp_path, image_tree):
    import fastdata
    from fastdata.packers.source import Source

    items = [(s.key, s.label, s.data) for s in image_tree.samples]
    src = _MemorySource(items, image_tree.classes)
    assert isinstance(src, Source)
    summary = fastdata.pack(src, tmp_path / "mem.lmdb", progress=False)
    assert summary.records == len(items) and summary.warnings == ["a word from the source"]
    ds = fastdata.open_dataset(tmp_path / "mem.lmdb", decode=fastdata.Decode(output="bytes"))
    assert [(bytes(ds[i][0]), ds[i][1]) for i in range(len(ds))] == [(d, lbl) for _, lbl, d in items]
    assert ds.keys == [k for k, _, _ in items]
    assert ds.manifest.source["kind"] == "memory" and ds.manifest.source["root"] is None


def test_pack_takes_an_image_folder_source_and_its_subset(tmp_path, image_tree):
    import fastdata

    src = ImageFolderSource(image_tree.root)
    whole = fastdata.pack(src, tmp_path / "a.h5", progress=False)
    by_path = fastdata.pack(image_tree.root, tmp_path / "b.h5", progress=False)
    assert whole.records == by_path.records == len(image_tree.samples)
    assert fastdata.formats.read_manifest(tmp_path / "a.h5").source == \
        fastdata.formats.read_manifest(tmp_path / "b.h5").source
    sub = src.subset([3, 0, 5])
    assert sub.classes == src.classes and len(sub) == 3
    fastdata.pack(sub, tmp_path / "c.h5", progress=False)
    ds = fastdata.open_dataset(tmp_path / "c.h5", decode=fastdata.Decode(output="bytes"))
    assert ds.keys == [image_tree.samples[i].key for i in (3, 0, 5)]
    assert ds.targets == [image_tree.samples[i].label for i in (3, 0, 5)]


def test_a_subset_warns_only_about_classes_empty_in_the_tree(image_tree):
    src = ImageFolderSource(image_tree.root)
    first_class_only = [i for i, e in enumerate(src) if e.label == 0]
    sub = src.subset(first_class_only)
    assert sub.empty_classes == src.empty_classes == ["z_empty"]
    assert sub.warnings() == src.warnings()


def test_pack_options_extensions(tmp_path):
    import fastdata

    build_tree(tmp_path / "src", ["a/x.png", "a/y.gif"])
    summary = fastdata.pack(tmp_path / "src", tmp_path / "g.h5", progress=False,
                            options=fastdata.PackOptions(extensions="+gif"))
    assert summary.records == 2 and summary.ignored_extensions == {}
    with pytest.raises(FastDataError, match="extensions= applies to a folder source"):
        fastdata.pack(ImageFolderSource(tmp_path / "src"), tmp_path / "s.h5", progress=False,
                      options=fastdata.PackOptions(extensions="gif"))
    assert not (tmp_path / "s.h5").exists()
    # A Source brings its own: recorded in the manifest's source, not pack_options.
    fastdata.pack(ImageFolderSource(tmp_path / "src", extensions="gif"), tmp_path / "o.h5",
                  progress=False)
    m = fastdata.formats.read_manifest(tmp_path / "o.h5")
    assert m.source["extensions"] == ["gif"] and m.pack_options["extensions"] is None
    assert m.source["ignored_extensions"] == {"png": 1}


def test_a_folders_entries_are_held_compactly(tmp_path):
    """About 45 bytes a file (its key's bytes and 12 more), where a list of
    SourceEntry objects took about 260: an ImageNet-21k folder's 14 million
    files fit in under a gigabyte."""
    import tracemalloc

    for c in range(4):
        (tmp_path / f"class_{c}").mkdir()
        for i in range(5000):
            (tmp_path / f"class_{c}" / f"n{c:08d}_{i:06d}.JPEG").touch()
    tracemalloc.start()
    try:
        src = ImageFolderSource(tmp_path)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(src) == 20_000 and held / len(src) < 80, held / len(src)
    first, last = src.entries[0], src.entries[-1]
    assert (first.key, first.label, first.path) == (
        "class_0/n00000000_000000.JPEG", 0, str(tmp_path / "class_0/n00000000_000000.JPEG"))
    assert (last.key, last.label) == ("class_3/n00000003_004999.JPEG", 3)
    assert [e.key for e in src.subset([3, 0]).entries] == [src.entries[3].key, first.key]
