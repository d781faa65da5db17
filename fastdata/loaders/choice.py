"""How ``fastdata.loader()`` runs a dataset when not told: worker processes, or
decode threads in this process with a background thread making batches ahead.

The rule, from what the data costs (measured in bench/RESULTS.md, "Defaults"):

* fastdata's own decoding (map-style datasets and mixtures giving tensors or
  arrays, with no per-sample Python transform) runs on threads that release
  the GIL, so one process decodes on every core: no worker processes (no
  fork, no batch sent through shared memory), a background thread keeping
  ``run_ahead`` batches ready, the float conversion done in that thread when
  there is no GPU. Past ``THREADS_PER_PROCESS`` cores the Python work per
  record that holds the GIL starts to limit one process: a worker per
  ``THREADS_PER_PROCESS`` cores, each decoding on its share of threads.
* A stream decodes on threads too: up to ``THREADS_PER_PROCESS`` cores it is
  read in this process a batch at a time, ``run_ahead`` batches ahead on a
  background thread (its ``state_dict()`` counts the batches the loop took,
  not those made); on 2 cores that beat one or two worker processes
  (bench/RESULTS.md). Beyond, a worker per ``THREADS_PER_PROCESS`` cores.
* Python per sample (a ``transform``, PIL or bytes output, a dataset fastdata
  does not know) holds the GIL: a worker process per core, at most 8.

The choice depends only on the dataset's kind and options and the usable
cores, so it is the same on every run of a machine, and it never changes the
samples or their order (the order engine gives each batch whatever runs it).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Cores one process's decode threads use before another process helps.
THREADS_PER_PROCESS = 8


@dataclass(frozen=True)
class LoadingChoice:
    """Worker processes, and batches a background thread keeps ready (0: none),
    with the reason in words."""

    num_workers: int
    run_ahead: int
    reason: str

    def __str__(self) -> str:
        how = (f"{self.num_workers} worker process{'es' if self.num_workers != 1 else ''}"
               if self.num_workers else "no worker processes")
        ahead = f", {self.run_ahead} batches ahead on a background thread" \
            if self.run_ahead else ""
        return f"{how}{ahead}: {self.reason}"


def _python_per_sample(dataset) -> str | None:
    """What in ``dataset`` runs Python per sample, or None."""
    if not hasattr(dataset, "_decoders"):
        return f"{type(dataset).__name__} is not a fastdata dataset; its work may hold the GIL"
    if getattr(dataset, "transform", None) is not None or \
            getattr(dataset, "target_transform", None) is not None:
        return "a per-sample Python transform holds the GIL"
    if getattr(dataset, "output", "tensor") in ("pil", "bytes"):
        return f"output={dataset.output!r} makes a Python object per sample"
    return None


def choose_loading(dataset, cores: int, run_ahead: int, streaming: bool) -> LoadingChoice:
    """The way ``loader()`` runs ``dataset`` on ``cores`` usable cores."""
    cores = max(1, int(cores))
    python = _python_per_sample(dataset)
    if python is not None:
        return LoadingChoice(min(8, cores), 0, python)
    processes = -(-cores // THREADS_PER_PROCESS)
    if streaming and processes == 1:
        from fastdata.loaders.stream_batches import batchable

        if not batchable(dataset):   # per sample, its position must be the loop's
            return LoadingChoice(0, 0, f"fastdata decodes the stream on {cores} threads in "
                                       f"this process; read per sample, nothing runs ahead")
        return LoadingChoice(0, run_ahead, f"fastdata decodes the stream on {cores} threads "
                                           f"in this process, a batch at a time")
    if processes > 1:
        return LoadingChoice(processes, 0, f"fastdata decodes on threads; {cores} cores are "
                                           f"more than one process's {THREADS_PER_PROCESS}")
    return LoadingChoice(0, run_ahead, f"fastdata decodes on {cores} threads in this process "
                                       f"with the GIL released")
