"""Views: a dataset's records selected without copying them (``fastdata
subset``), stored as a small view file beside the dataset; no torch."""
