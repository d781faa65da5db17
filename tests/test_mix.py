"""fastdata.mix: several packed datasets (an LMDB and tar shards, one at an
S3-protocol URL) read as one map-style Dataset: shares, samples that know
their source, labels kept or merged, equal batches per rank, exact resume
(after a change of workers or ranks too), refusals before any batch, and a
2-process gloo run."""

from __future__ import annotations

from collections import Counter

import numpy as np
import optional
import pytest
import torch
from torch.utils.data import DataLoader

import fastdata
from conftest import build_tree, run_ranks, uniform_spec
from fastdata import Decode, Order

StatefulDataLoader = optional.require("torchdata").StatefulDataLoader

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
BATCH = 5
DECODE = Decode(size=(8, 8))


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """'pets': 12 images, classes cat/dog, LMDB; 'zoo': 21 images, classes
    cat/dog/eel, tar shards of 8; 'raw': 6 pre-decoded records."""
    root = tmp_path_factory.mktemp("mix")
    pets = build_tree(root / "pets", uniform_spec(("cat", "dog"), 6), size=(12, 12))
    zoo = build_tree(root / "zoo", uniform_spec(("cat", "dog", "eel"), 7), size=(14, 10))
    out = {"pets": str(root / "pets.lmdb"), "zoo": str(root / "zoo.tar"),
           "raw": str(root / "raw.lmdb")}
    fastdata.pack(pets.root, out["pets"], options=fastdata.PackOptions(workers=1),
                  progress=False)
    fastdata.pack(zoo.root, out["zoo"], options=fastdata.PackOptions(workers=1, shard_size=8),
                  progress=False)
    from fastdata.packers.preprocess import Preprocess

    fastdata.pack(pets.root, out["raw"], options=fastdata.PackOptions(
        workers=1, preprocess=Preprocess(resize=(8, 8), encoding="raw")), progress=False)
    return out


def _mix(packs, order=None, **options):
    sources = {"pets": {"path": packs["pets"], "weight": 1},
               "zoo": {"path": packs["zoo"], "weight": 2}}
    return fastdata.mix(sources, samples_per_epoch=30, decode=DECODE,
                        order=order or Order(shuffle=True, seed=3, batch_size=BATCH), **options)


def _positions(ds, loader):
    """(source, record) of every sample a loader gives, through the metadata."""
    return [(m["source"], m["index"]) for _, _, metas in loader for m in metas]


def test_samples_know_their_source_and_keep_its_pixels_and_label(packs):
    ds = _mix(packs, with_metadata=True)
    assert len(ds) == 30 and ds.counts() == {"pets": 10, "zoo": 20}
    batches = list(fastdata.loader(ds, num_workers=0, device="cpu"))
    assert [len(b[1]) for b in batches] == [BATCH] * 6
    assert batches[0][0].dtype == torch.float32  # the loader's usual batches
    plain = {name: fastdata.open_dataset(path, decode=DECODE) for name, path in packs.items()}
    seen = Counter()
    sampler = fastdata.EpochBatches(ds)
    for batch in DataLoader(ds, batch_sampler=sampler, collate_fn=fastdata.collate):
        images, labels, metas = batch
        for image, label, meta in zip(images, labels, metas):
            want_image, want_label = plain[meta["source"]][meta["index"]]
            assert torch.equal(image, want_image) and int(label) == want_label
            seen[meta["source"]] += 1
    assert seen == {"pets": 10, "zoo": 20}  # the weights' shares, exactly
    # Spread through the epoch: every batch of 5 holds 1-2 pets and 3-4 zoo.
    sources = [m["source"] for _, _, metas in DataLoader(
        ds, batch_sampler=fastdata.EpochBatches(ds), collate_fn=fastdata.collate)
        for m in metas]
    for k in range(0, 30, BATCH):
        assert 1 <= sources[k:k + BATCH].count("pets") <= 2


def test_every_record_of_the_larger_source_is_seen_before_it_repeats(packs):
    ds = fastdata.mix({"pets": {"path": packs["pets"], "count": 9},
                       "zoo": {"path": packs["zoo"], "count": 9}}, decode=DECODE,
                      order=Order(shuffle=True, seed=1, batch_size=6), with_metadata=True)
    loader = DataLoader(ds, batch_sampler=fastdata.EpochBatches(ds), collate_fn=fastdata.collate)
    epochs = [_positions(ds, loader) for _ in range(3)]  # EpochBatches moves on each pass
    zoo = [i for epoch in epochs for s, i in epoch if s == "zoo"]
    assert sorted(zoo[:21]) == list(range(21))  # 9 + 9 + 3: all 21 before any repeat
    pets = [i for epoch in epochs for s, i in epoch if s == "pets"]
    assert sorted(pets[:12]) == list(range(12)) and sorted(pets[12:24]) == list(range(12))


def test_labels_own_union_merge_or_a_list(packs):
    own = _mix(packs)
    with pytest.raises(fastdata.FastDataError, match="each source's own"):
        own.classes
    union = _mix(packs, classes="union")
    assert union.classes == ["cat", "dog", "eel"]
    # A zoo 'eel' stays 2, a pets 'dog' stays 1: mapped by name.
    with pytest.raises(fastdata.FastDataError, match="'zoo' have other classes than 'pets'"):
        _mix(packs, classes="merge")
    listed = _mix(packs, classes=["eel", "dog", "cat"], with_metadata=True)
    for images, labels, metas in DataLoader(listed, batch_sampler=fastdata.EpochBatches(listed),
                                            collate_fn=fastdata.collate):
        for label, meta in zip(labels.tolist(), metas):
            source = listed.sources[meta["source"]]
            name = source.classes[source.targets[meta["index"]]]
            assert listed.classes[label] == name
    with pytest.raises(fastdata.FastDataError, match="'zoo' has classes not in the classes"):
        _mix(packs, classes=["cat", "dog"])


def test_every_rank_gets_equal_batches_and_the_ranks_read_the_epoch(packs):
    whole = _positions(None, DataLoader(_mix(packs, with_metadata=True), batch_sampler=
                                        fastdata.EpochBatches(_mix(packs, with_metadata=True)),
                                        collate_fn=fastdata.collate))
    for world in (2, 3, 4, 7):
        per_rank = []
        for rank in range(world):
            ds = _mix(packs, Order(shuffle=True, seed=3, batch_size=BATCH, rank=rank,
                                   world_size=world), with_metadata=True)
            per_rank.append([[(m["source"], m["index"]) for m in metas] for _, _, metas in
                             DataLoader(ds, batch_sampler=fastdata.EpochBatches(ds),
                                        collate_fn=fastdata.collate)])
        assert len({len(batches) for batches in per_rank}) == 1  # equal batches
        # Round by round, the ranks' batches are the single process's order
        # (padded at the end with its first samples).
        rounds = [s for t in range(len(per_rank[0])) for r in range(world)
                  for s in per_rank[r][t]]
        assert rounds[:len(whole)] == whole
        assert rounds[len(whole):] == whole[:len(rounds) - len(whole)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_continues_the_uninterrupted_sequence(packs, workers):
    def loader():
        ds = _mix(packs, with_metadata=True)
        return StatefulDataLoader(ds, batch_sampler=fastdata.EpochBatches(ds),
                                  num_workers=workers, collate_fn=fastdata.collate,
                                  multiprocessing_context="fork" if workers else None)

    def records_and_pixels(batches):
        """Each batch's (source, record) positions, and its pixels' bytes."""
        return [([(m["source"], m["index"]) for m in metas], images.numpy().tobytes())
                for images, _, metas in batches]

    full = loader()
    want = records_and_pixels([b for _ in range(2) for b in full])  # epochs 0 and 1
    assert len(want) == 12  # 6 batches of 5 an epoch
    first = loader()
    it = iter(first)
    got = records_and_pixels([next(it) for _ in range(2)])
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = records_and_pixels(resumed)          # the rest of epoch 0
    assert len(rest) == 4 and got + rest == want[:6]
    state = resumed.state_dict()
    again = loader()                            # once more, at the end of the epoch
    again.load_state_dict(state)
    epoch1 = records_and_pixels(again)          # epoch 1, whole
    assert len(epoch1) == 6 and epoch1 == want[6:]
    assert [b for b, _ in want[:6]] != [b for b, _ in want[6:]]  # epoch 1: another order


def test_a_resume_with_other_ranks_continues_the_epoch(packs):
    ds = _mix(packs, with_metadata=True)
    sampler = fastdata.EpochBatches(ds)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=fastdata.collate)
    whole = _positions(ds, loader)
    sampler = fastdata.EpochBatches(ds)
    it = iter(DataLoader(ds, batch_sampler=sampler, collate_fn=fastdata.collate))
    done = [(m["source"], m["index"]) for _ in range(2) for m in next(it)[2]]
    state = sampler.state_dict()
    rest = []
    parts = []
    for rank in range(2):
        other = _mix(packs, Order(shuffle=True, seed=3, batch_size=BATCH, rank=rank,
                                  world_size=2), with_metadata=True)
        s = fastdata.EpochBatches(other)
        s.load_state_dict(state)
        parts.append([[(m["source"], m["index"]) for m in metas] for _, _, metas in
                      DataLoader(other, batch_sampler=s, collate_fn=fastdata.collate)])
    rest = [x for t in range(len(parts[0])) for r in range(2) for x in parts[r][t]]
    assert done + rest[:len(whole) - len(done)] == whole


def test_a_state_of_another_mixture_is_refused(packs):
    state = fastdata.EpochBatches(_mix(packs)).state_dict()
    heavier = fastdata.mix({"pets": {"path": packs["pets"], "weight": 1},
                            "zoo": {"path": packs["zoo"], "weight": 3}}, samples_per_epoch=30,
                           decode=DECODE, order=Order(shuffle=True, seed=3, batch_size=BATCH))
    with pytest.raises(ValueError, match="another order.*mixture"):
        fastdata.EpochBatches(heavier).load_state_dict(state)


def test_bad_mixtures_are_refused_before_any_batch(packs, tmp_path):
    with pytest.raises(fastdata.FastDataError, match="mixture source 'gone'.*no such"):
        fastdata.mix({"pets": {"path": packs["pets"], "weight": 1},
                      "gone": {"path": str(tmp_path / "missing.lmdb"), "weight": 1}})
    with pytest.raises(fastdata.FastDataError, match="store images differently.*raw 8x8x3"):
        fastdata.mix({"pets": {"path": packs["pets"], "weight": 1},
                      "raw": {"path": packs["raw"], "weight": 1}})
    # With one fixed size the raw and the encoded records share batches.
    fine = fastdata.mix({"pets": {"path": packs["pets"], "weight": 1},
                         "raw": {"path": packs["raw"], "weight": 1}}, decode=DECODE,
                        order=Order(batch_size=4))
    images, labels = next(iter(fastdata.loader(fine, num_workers=0, device="cpu")))
    assert images.shape == (4, 3, 8, 8)
    with pytest.raises(ValueError, match="unknown keys"):
        fastdata.mix({"pets": {"path": packs["pets"], "share": 1}})


def _zoo_on_s3(packs, s3_server, bucket: str) -> str:
    """The zoo tar shards uploaded as they are; their manifest's URL."""
    import os

    s3_server.make_bucket(bucket)
    folder = os.path.dirname(packs["zoo"])
    for n in os.listdir(folder):
        if n.startswith("zoo") and os.path.isfile(os.path.join(folder, n)):
            with open(os.path.join(folder, n), "rb") as f:
                s3_server.put(f"s3://{bucket}/{n}", f.read())
    return f"s3://{bucket}/zoo.tar"


def test_a_source_at_an_s3_url_mixes_with_a_local_one(packs, s3_server, s3_env, tmp_path,
                                                      monkeypatch):
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    _zoo_on_s3(packs, s3_server, "mixzoo")
    remote = fastdata.mix({"pets": {"path": packs["pets"], "weight": 1},
                           "zoo": {"path": "s3://mixzoo/zoo.tar", "weight": 2}},
                          samples_per_epoch=30, decode=DECODE, with_metadata=True,
                          order=Order(shuffle=True, seed=3, batch_size=BATCH))
    local = _mix(packs, with_metadata=True)
    got = list(fastdata.loader(remote, num_workers=0, device="cpu"))
    want = list(fastdata.loader(local, num_workers=0, device="cpu"))
    assert len(got) == len(want) == 6  # 30 samples in batches of 5
    for (images, labels, metas), (want_images, want_labels, want_metas) in zip(got, want):
        assert [(m["source"], m["index"]) for m in metas] == \
            [(m["source"], m["index"]) for m in want_metas]
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


DDP_SCRIPT = """
    import json, sys
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    import fastdata

    init, rank, world, out, pets, zoo = sys.argv[1:7]
    dist.init_process_group("gloo", init_method=init, rank=int(rank),
                            world_size=int(world))
    try:
        ds = fastdata.mix({"pets": {"path": pets, "weight": 1}, "zoo": {"path": zoo, "weight": 2}},
                          samples_per_epoch=31, decode=fastdata.Decode(size=(8, 8)),
                          order=fastdata.Order(shuffle=True, seed=3, batch_size=4),
                          with_metadata=True)
        loader = DataLoader(ds, batch_sampler=fastdata.EpochBatches(ds), num_workers=2,
                            multiprocessing_context="fork", collate_fn=fastdata.collate)
        batches = [[[m["source"], m["index"]] for m in metas] for _, _, metas in loader]
        json.dump({"batches": batches}, open(out, "w"))
    finally:
        dist.destroy_process_group()
"""


def test_two_ranks_under_torch_distributed_read_the_mixture_once(packs, tmp_path, s3_server,
                                                                 s3_env, monkeypatch):
    # The tar source at an S3-protocol URL (the ranks inherit its endpoint).
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    zoo = _zoo_on_s3(packs, s3_server, "mixddp")
    results = run_ranks(DDP_SCRIPT, 2, [packs["pets"], zoo], tmp_path, timeout=120)
    batches = [r["batches"] for r in results]
    assert len(batches[0]) == len(batches[1]) == 4  # 31 samples, 2 ranks, batches of 4
    ds = fastdata.mix({"pets": {"path": packs["pets"], "weight": 1},
                       "zoo": {"path": packs["zoo"], "weight": 2}}, samples_per_epoch=31,
                      decode=DECODE, order=Order(shuffle=True, seed=3, batch_size=4),
                      with_metadata=True)
    whole = [list(p) for p in _positions(ds, DataLoader(
        ds, batch_sampler=fastdata.EpochBatches(ds), collate_fn=fastdata.collate))]
    rounds = [s for t in range(4) for r in range(2) for s in batches[r][t]]
    assert rounds[:31] == whole and rounds[31:] == whole[:1]  # one pad sample
    assert np.bincount([0 if s == "pets" else 1 for s, _ in whole]).tolist() == [10, 21]


def test_a_mixture_file_opens_with_open_dataset_and_shows_in_info(packs, tmp_path):
    import json
    import os

    from click.testing import CliRunner

    from fastdata.cli import main

    spec = {"sources": {"pets": {"path": os.path.relpath(packs["pets"], tmp_path),
                                 "weight": 1},
                        "zoo": {"path": packs["zoo"], "weight": 2}},
            "samples_per_epoch": 30, "classes": "union", "seed": 3}
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(spec))
    from_file = fastdata.open_dataset(str(path), decode=DECODE, with_metadata=True,
                                      order=Order(shuffle=True, seed=3, batch_size=BATCH))
    assert isinstance(from_file, fastdata.MixedDataset) and from_file.classes == [
        "cat", "dog", "eel"]
    from_mapping = fastdata.open_dataset(
        {"pets": {"path": packs["pets"], "weight": 1}, "zoo": {"path": packs["zoo"], "weight": 2}},
        decode=DECODE, order=Order(shuffle=True, seed=3, batch_size=BATCH),
        samples_per_epoch=30, classes="union", with_metadata=True)
    got = list(fastdata.loader(from_file, num_workers=0, device="cpu"))
    want = list(fastdata.loader(from_mapping, num_workers=0, device="cpu"))
    assert len(got) == len(want) == 6  # 30 samples in batches of 5
    for (images, labels, metas), (want_images, want_labels, want_metas) in zip(got, want):
        assert [(m["source"], m["index"]) for m in metas] == \
            [(m["source"], m["index"]) for m in want_metas]
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
    result = CliRunner().invoke(main, ["info", str(path)])
    assert result.exit_code == 0, result.output
    assert "a mixture of 2 sources, 30 samples per epoch" in result.output
    assert "pets" in result.output and "10 per epoch" in result.output
    assert "3 classes (classes='union')" in result.output
    as_json = json.loads(CliRunner().invoke(main, ["info", str(path), "--json"]).output)
    assert [s["per_epoch"] for s in as_json["sources"]] == [10, 20]
    assert as_json["epochs"][0] == {"pets": 10, "zoo": 20}
    # Bad files are refused with the file and the key named.
    path.write_text(json.dumps({**spec, "weights": 1}))
    result = CliRunner().invoke(main, ["info", str(path)])
    assert result.exit_code != 0 and "unknown keys ['weights']" in result.output


def test_the_bench_measures_a_mixture_beside_its_sources(packs, tmp_path):
    import json

    from click.testing import CliRunner

    from fastdata.cli import main

    path = tmp_path / "mix.json"
    path.write_text(json.dumps({"sources": {"pets": {"path": packs["pets"], "weight": 1},
                                            "zoo": {"path": packs["zoo"], "weight": 1}}}))
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", packs["pets"], str(path), "--workers", "0",
                                       "--epochs", "1", "--size", "16", "--batch-size", "8",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    mixed = rows["mixture pets+zoo"]
    assert mixed["samples_per_s"] > 0 and mixed["format"] == "mixture"


def test_a_changed_mixture_continues_from_the_old_ones_point(packs):
    """Other weights (and a source left out) from the point an old run stopped:
    the sources kept go on after what they gave, nothing repeated."""
    old = _mix(packs, with_metadata=True)
    sampler = fastdata.EpochBatches(old)
    loader = DataLoader(old, batch_sampler=sampler, collate_fn=fastdata.collate)
    it = iter(loader)
    seen = [(m["source"], m["index"]) for _ in range(3) for m in next(it)[2]]  # 15 of 30
    state = sampler.state_dict()
    def equal_weights():
        return fastdata.mix({"pets": {"path": packs["pets"], "weight": 1},
                             "zoo": {"path": packs["zoo"], "weight": 1}}, samples_per_epoch=30,
                            decode=DECODE, order=Order(shuffle=True, seed=3, batch_size=BATCH),
                            with_metadata=True)

    with pytest.raises(ValueError, match="another order"):  # a plain resume is refused
        fastdata.EpochBatches(equal_weights()).load_state_dict(state)
    new = equal_weights()
    point = new.continue_from(state)
    batches = fastdata.EpochBatches(new)
    batches.load_state_dict(point)
    assert new.counts() == {"pets": 15, "zoo": 15}
    after = _positions(new, DataLoader(new, batch_sampler=batches, collate_fn=fastdata.collate))
    pets = [i for s, i in seen + after if s == "pets"]
    zoo = [i for s, i in seen + after if s == "zoo"]
    # pets (12 records) gave 5 before and 15 after: its first 12 are all of it
    # once, the rest a new cycle; zoo (21) gave 10 + 15: its first 21, once each.
    assert sorted(pets[:12]) == list(range(12)) and len(set(pets[12:])) == len(pets[12:])
    assert sorted(zoo[:21]) == list(range(21))
    assert len(after) == 30
    # The new run's own state resumes it: saved after 2 of its batches, the
    # rest of them, in order; saved at the end of its pass, its next epoch.
    part = fastdata.EpochBatches(new)
    part.load_state_dict(point)
    it = iter(DataLoader(new, batch_sampler=part, collate_fn=fastdata.collate))
    head = [(m["source"], m["index"]) for _ in range(2) for m in next(it)[2]]
    again = fastdata.EpochBatches(new)
    again.load_state_dict(part.state_dict())
    rest = _positions(new, DataLoader(new, batch_sampler=again, collate_fn=fastdata.collate))
    assert head == after[:2 * BATCH] and rest == after[2 * BATCH:] and len(rest) == 20
    end = batches.state_dict()
    following = _positions(new, DataLoader(new, batch_sampler=batches,
                                           collate_fn=fastdata.collate))
    again = fastdata.EpochBatches(new)
    again.load_state_dict(end)
    resumed = _positions(new, DataLoader(new, batch_sampler=again, collate_fn=fastdata.collate))
    assert len(following) == 30 and resumed == following
    # A state of a mixture read with another seed is not continued.
    other = fastdata.mix({"pets": {"path": packs["pets"], "weight": 1}}, decode=DECODE,
                         order=Order(shuffle=True, seed=4))
    with pytest.raises(ValueError, match="seed 3.*seed 4"):
        other.continue_from(state)


def test_a_weight_schedule_changes_the_shares_each_epoch(packs):
    ds = fastdata.mix({"pets": {"path": packs["pets"]}, "zoo": {"path": packs["zoo"]}},
                      samples_per_epoch=20, decode=DECODE, with_metadata=True,
                      schedule=lambda epoch: {"pets": 1.0, "zoo": float(epoch)},
                      order=Order(shuffle=True, batch_size=BATCH))
    loader = DataLoader(ds, batch_sampler=fastdata.EpochBatches(ds), collate_fn=fastdata.collate)
    shares = [Counter(s for s, _ in _positions(ds, loader)) for _ in range(3)]
    assert shares == [{"pets": 20}, {"pets": 10, "zoo": 10}, {"pets": 7, "zoo": 13}]


def test_a_repeated_record_gets_a_new_random_crop_each_time(packs):
    def epoch():
        ds = fastdata.mix({"pets": {"path": packs["pets"], "count": 30}},
                          decode=Decode(crop=fastdata.RandomResizedCrop(8)), with_metadata=True,
                          order=Order(shuffle=True, seed=2, batch_size=10))
        loader = DataLoader(ds, batch_sampler=fastdata.EpochBatches(ds),
                            collate_fn=fastdata.collate)
        return [(m["index"], image) for images, _, metas in loader
                for image, m in zip(images, metas)]

    first, again = epoch(), epoch()
    assert len(first) == len(again) == 30
    assert [i for i, _ in first] == [j for j, _ in again]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(first, again))
    by_record: dict = {}
    for index, image in first:  # 12 records, 30 samples: each 2 or 3 times
        by_record.setdefault(index, []).append(image)
    repeated = [images for images in by_record.values() if len(images) > 1]
    assert len(repeated) == 12
    assert all(not torch.equal(images[0], images[1]) for images in repeated)


def test_close_stops_the_sources_threads_and_they_come_back(packs):
    ds = _mix(packs)
    first = next(iter(fastdata.loader(ds, num_workers=0, device="cpu", run_ahead=0)))
    pools = [source._decoders for source in ds.sources.values()]
    threads = {t for pool in pools if pool._executor is not None for t in pool._executor._threads}
    ds.close()
    assert all(pool._executor is None for pool in pools)
    assert not any(t.is_alive() for t in threads)
    again = next(iter(fastdata.loader(ds, num_workers=0, device="cpu", run_ahead=0)))
    assert torch.equal(first[0], again[0])
