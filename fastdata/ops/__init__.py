"""Jobs over a dataset: append, join, subset, gc; no torch."""
