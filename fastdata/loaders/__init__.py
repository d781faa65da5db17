"""Read side: one reader per format (no torch), decoders, and the torch Datasets."""
