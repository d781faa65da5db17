"""Write side (no torch): ``pack()`` and ``convert()``, their options
(``PackOptions``), the sources they read (the ``Source`` protocol, the
image-folder source; lists, tables and packed datasets in ``sources/``), the
per-image checks and pre-processing, the plan, the worker pool, the journal of
a resumable pack, packing on a Dask cluster and packing to a URL. The writer
of each format lives in fastdata.formats."""
