"""Sources beyond the image folder, one module per kind: CSV/TSV and JSON Lines
lists of image files, Parquet tables in the Hugging Face image layout, and
packed datasets (what ``fastdata convert`` reads);
``open_source`` picks one for a path. None imports a third-party library when
imported (pyarrow loads when a Parquet table is opened)."""

from __future__ import annotations

from fastdata.packers.sources.csv_list import CSVSource
from fastdata.packers.sources.dataset import DatasetSource
from fastdata.packers.sources.dispatch import FILE_KINDS, open_source, source_kind
from fastdata.packers.sources.json_lines import JSONLinesSource
from fastdata.packers.sources.labels import UNLABELLED
from fastdata.packers.sources.parquet import ParquetSource

__all__ = ["FILE_KINDS", "UNLABELLED", "CSVSource", "DatasetSource", "JSONLinesSource",
           "ParquetSource", "open_source", "source_kind"]
