"""Read side, the torch layer: ``open_dataset``, the map-style Datasets (one class
per format, over the readers of fastdata.formats), streams
(``ShardedIterableDataset``), mixtures (``mix``), map-style batches in the
order engine's order (``EpochBatches``), ``loader()``, ``collate``, the RAM
cache, batches made ahead (``BackgroundBatches``) and the GPU prefetcher
(``CUDAPrefetcher``). The readers live in fastdata.formats, the decoders in
fastdata.decoding, the sample order in fastdata.order; each name here is
reached through its module (``fastdata.loaders.opening.open_dataset``) or the
top level (``fastdata.open_dataset``)."""
