"""Jobs over a whole dataset: pieces, executors and merges."""
