"""Versions: a dataset that changes without re-packing (``fastdata pack
--append``, ``fastdata join``), each change an immutable version beside the
dataset; no torch."""
