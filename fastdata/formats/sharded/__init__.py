"""The machinery shared by sharded formats (tar, TFRecord): naming, index, writer and reader bases."""
