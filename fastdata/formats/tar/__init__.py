"""Tar: webdataset-style tar shards (KEY.jpg + KEY.cls); streamable, read by webdataset."""

from __future__ import annotations

from fastdata.formats.registry import FormatSpec, WriterOption
from fastdata.formats.tar.schema import EXTENSIONS

SPEC = FormatSpec(
    name="tar",
    extensions=EXTENSIONS,
    writer="fastdata.formats.tar.writer:TarWriter",
    reader="fastdata.formats.tar.reader:TarReader",
    help="webdataset-style tar shards (KEY.jpg + KEY.cls); streamable, webdataset readable",
    sharded=True,
    options=(
        WriterOption(
            "split", metavar="NAME",
            help="the split this output is in timm's dataset info, _info.json in the "
                 "shards' folder, which timm.data.create_dataset('wds/NAME', root=FOLDER, "
                 "split=NAME) reads. Each output packed into one folder gets its own entry "
                 "(pack train, then val: both are there). Default: the output's name without "
                 "shard number and extension (train-%06d.tar: train); timm takes a name with "
                 "'tar' or '..' in it for a shard pattern, so such a name is refused here, and "
                 "such a default gets no entry."),
        WriterOption(
            "source_extensions", type=bool,
            help="name each image member after its source file's extension, lower-cased "
                 "(IMG_1.JPEG: IMG_1.jpeg, b.tif: b.tif), as earlier fastdata versions did, "
                 "instead of one extension per encoding (jpg, png, webp, ...). The default is "
                 "what webdataset's .to_tuple('jpg', 'cls'), timm and Hugging Face datasets "
                 "look for; keep the source's spelling only for readers that select members "
                 "by it (a pipeline written for such shards). The dataset's keys keep the "
                 "source names either way."),
    ),
)
