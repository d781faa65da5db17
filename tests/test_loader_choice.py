"""How fastdata.loader() runs a dataset when not told: the rule, that it is
visible, and that it never changes the samples or their order."""

from __future__ import annotations

import logging

import pytest
import torch

import fastdata
from fastdata.demo import synthesize
from fastdata.loaders.choice import choose_loading
from worker_pids import CollatedIn, StartedIn, assert_other_processes


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("choice")
    synthesize(tmp / "src", kind="tiny", n=300, seed=1)
    lmdb = fastdata.pack(tmp / "src", tmp / "d.lmdb", progress=False).output
    tar = fastdata.pack(tmp / "src", tmp / "d-%06d.tar",
                        options=fastdata.PackOptions(shard_size=100), progress=False).output
    return lmdb, tar


ORDER = fastdata.Order(shuffle=True, seed=4, batch_size=32)


@pytest.mark.parametrize("cores, workers, background", [
    (1, 0, 2), (2, 0, 2), (8, 0, 2), (9, 2, 0), (16, 2, 0), (64, 8, 0)])
def test_fastdatas_own_decoding_runs_on_threads_then_one_process_per_8_cores(
        packs, cores, workers, background):
    ds = fastdata.open_dataset(packs[0], order=ORDER)
    choice = choose_loading(ds, cores, 2, streaming=False)
    assert (choice.num_workers, choice.run_ahead) == (workers, background)
    assert choice == choose_loading(ds, cores, 2, streaming=False)  # the same every time


@pytest.mark.parametrize("cores, workers, background", [(2, 0, 2), (8, 0, 2), (16, 2, 0)])
def test_a_stream_is_read_in_this_process_up_to_8_cores(packs, cores, workers, background):
    ds = fastdata.open_dataset(packs[1], streaming=True, order=ORDER)
    choice = choose_loading(ds, cores, 2, streaming=True)
    assert (choice.num_workers, choice.run_ahead) == (workers, background)
    numpy = fastdata.open_dataset(packs[1], streaming=True, order=ORDER,
                                  decode=fastdata.Decode(output="numpy"))
    assert choose_loading(numpy, 2, 2, streaming=True).run_ahead == 0  # read per sample


def test_python_per_sample_gets_worker_processes(packs):
    with_transform = fastdata.open_dataset(packs[0], order=ORDER, transform=lambda x: x)
    assert choose_loading(with_transform, 4, 2, streaming=False).num_workers == 4
    pil = fastdata.open_dataset(packs[0], order=ORDER, decode=fastdata.Decode(output="pil"))
    assert "pil" in choose_loading(pil, 16, 2, streaming=False).reason
    foreign = torch.utils.data.TensorDataset(torch.zeros(4, 3))
    choice = choose_loading(foreign, 16, 2, streaming=False)
    assert choice.num_workers == 8 and "not a fastdata dataset" in choice.reason


@pytest.mark.parametrize("streaming", [False, True])
def test_the_choice_changes_no_sample_and_no_order(packs, streaming, caplog, tmp_path,
                                                   monkeypatch):
    # The choice is made for 2 usable cores, whatever this machine has.
    import fastdata.machine

    monkeypatch.setattr(fastdata.machine, "usable_cores", lambda: 2)
    path = packs[1] if streaming else packs[0]

    def batches(**kw):
        ds = fastdata.open_dataset(path, streaming=streaming, order=ORDER)
        loader = fastdata.loader(ds, device="cpu", **kw)
        return loader, [(x.numpy().tobytes(), y.tolist()) for x, y in loader]

    with caplog.at_level(logging.DEBUG, logger="fastdata"):
        chosen, got = batches()
    # The worker processes recorded: the one collating each batch or, for a
    # stream (which loader() reads in batches only with its own collate), each
    # worker as it starts.
    log = tmp_path / "workers.pids"
    recorded = {"worker_init_fn": StartedIn(log)} if streaming else {
        "collate_fn": CollatedIn(log, fastdata.collate)}
    assert got == batches(num_workers=2, **recorded)[1] == batches(num_workers=0)[1]
    assert_other_processes(log, count=2)
    assert (chosen.choice.num_workers, chosen.choice.run_ahead) == (0, 2)
    how = ("fastdata decodes the stream on 2 threads in this process, a batch at a time"
           if streaming else "fastdata decodes on 2 threads in this process with the GIL released")
    assert repr(chosen) == ("CUDAPrefetcher(device='cpu', no worker processes, "
                            f"2 batches ahead on a background thread: {how})")
    assert any("fastdata.loader(" in r.getMessage() and str(chosen.choice) in r.getMessage()
               for r in caplog.records)
