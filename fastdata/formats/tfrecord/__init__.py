"""TFRecord: shards of tf.train.Example with tfrecord2idx index files; TensorFlow and DALI read them."""

from __future__ import annotations

from fastdata.formats.registry import FormatSpec

#: File extensions, the first one preferred (here, not in schema.py, which needs crc32c).
EXTENSIONS = (".tfrecord", ".tfrecords")

SPEC = FormatSpec(
    name="tfrecord",
    extensions=EXTENSIONS,
    writer="fastdata.formats.tfrecord.writer:TFRecordWriter",
    reader="fastdata.formats.tfrecord.reader:TFRecordReader",
    help="TFRecord shards of tf.train.Example with index files; TensorFlow/DALI readable",
    sharded=True,
)
