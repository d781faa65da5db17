"""The speed figures the README and the docs cite, made from bench/RESULTS.md.

    python bench/figures.py            # rewrite the figures page, README and home page
    python bench/figures.py --check    # exit 1 when one is not what RESULTS.md gives

Run from a checkout of the repository; it takes about a second.

bench/RESULTS.md is the one record of what was measured: every table there
was printed by the command above it. This script reads the tables of a few
of its sections and writes the figures as one page (docs/speed/figures.md),
as the README's comparison table (between its ``figures`` markers), and as
one headline sentence that the figures page, the README and the home page
(docs/index.md) each hold between ``headline`` markers, word for word. Each
row names its section, so a figure leads to its command, machine and date.
Ratios are worked out here from the tables' samples/s, best worker count
against best worker count.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
PAGE = ROOT / "docs" / "speed" / "figures.md"
README = ROOT / "README.md"
HOME = ROOT / "docs" / "index.md"
BEGIN, END = "<!-- figures:begin (bench/figures.py) -->", "<!-- figures:end -->"
HEAD_BEGIN, HEAD_END = "<!-- headline:begin (bench/figures.py) -->", "<!-- headline:end -->"

PHOTOS = "ImageNet-like photos, decoded and resized to 224×224"
TINY = "32×32 PNGs (CIFAR-like)"
PEERS = "Against other libraries (`bench/peers.py`)"
DEFAULTS = "Fast by default: what `open_dataset` + `fastdata.loader()` do with no options"


def sections(text: str) -> dict[str, str]:
    """``## `` section title -> its text (up to the next ``## ``)."""
    out = {}
    for part in re.split(r"(?m)^## ", text)[1:]:
        title, _, body = part.partition("\n")
        out[title.strip()] = body
    return out


def tables(body: str) -> list[list[dict[str, str]]]:
    """The Markdown tables of a section, each a list of rows by header."""
    found, current, header = [], None, None
    for line in body.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header, current = cells, []
            elif not all(set(c) <= set("-: ") for c in cells):
                current.append(dict(zip(header, cells)))
        elif header is not None:
            found.append(current)
            header, current = None, None
    return found


def number(cell: str) -> float:
    match = re.search(r"[\d,]+(?:\.\d+)?", cell)
    if match is None:
        raise SystemExit(f"bench/figures.py: no number in {cell!r} of bench/RESULTS.md")
    return float(match.group().replace(",", ""))


def best(rows: list[dict], name: str) -> float:
    """The most samples/s of the rows named ``name`` (one per worker count)."""
    got = [number(r["samples/s"]) for r in rows if r["row"] == name]
    if not got:
        raise SystemExit(f"bench/figures.py: no row {name!r} in bench/RESULTS.md")
    return max(got)


def peer_best(rows: list[dict], name: str) -> float:
    row = next((r for r in rows if r[next(iter(r))] == name), None)
    if row is None:
        raise SystemExit(f"bench/figures.py: no row {name!r} in bench/RESULTS.md")
    return max(number(row["0 workers"]), number(row["2 workers"]))


def fmt(x: float) -> str:
    return f"{x:,.0f}"


def ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}×"


def own_rows(rows: list[dict], names: list[tuple[str, str]]) -> list[str]:
    base = best(rows, "folder (PIL)")
    out = [f"| folder (PIL), the baseline | {fmt(base)} | 1.00× |"]
    for label, name in names:
        got = best(rows, name)
        out.append(f"| {label} | {fmt(got)} | {ratio(got, base)} |")
    return out


def spread(rows: list[dict], names: list[str]) -> str:
    """The range of ``names``' best rates over the folder's best, as ``1.60–1.67×``."""
    base = best(rows, "folder (PIL)")
    got = sorted(best(rows, name) / base for name in names)
    return f"{got[0]:.2f}–{got[-1]:.2f}×"


def headline(parts: dict[str, str]) -> str:
    """The one sentence of headline figures, without its link."""
    photos = tables(parts[PHOTOS])[0]
    kept = spread(photos, ["lmdb", "hdf5", "tfrecord", "tar"])
    resized = spread(photos, ["lmdb resize256", "tar resize256"])
    raw = spread(photos, ["lmdb raw (pre-decoded)", "tar raw (pre-decoded)"])
    return ("Measured by `fastdata bench --demo` on 2 CPU cores, photos decoded and "
            "resized to 224×224: packed with their original bytes, a dataset reads "
            f"at {kept} the rate of its image folder read with PIL; packed at "
            f"`--resize 256`, at {resized}; pre-decoded (`--encoding raw`), at "
            f"{raw}; each at its best worker count")


def headline_block(parts: dict[str, str], figures: str, label: str = "Figures") -> str:
    """The headline between its markers, its link to the figures at ``figures``."""
    return "\n".join([HEAD_BEGIN, wrap(f"{headline(parts)} ([{label}]({figures})).", 76),
                      HEAD_END])


def wrap(text: str, width: int) -> str:
    """``text`` in lines of at most ``width``, never broken inside `code`."""
    import textwrap

    glued = re.sub(r"`[^`]*`", lambda m: m.group().replace(" ", "\0"), text)
    lines = textwrap.fill(glued, width, break_long_words=False, break_on_hyphens=False)
    return lines.replace("\0", " ")


def link(section: str) -> str:
    return f"`bench/RESULTS.md`, section \"{section}\""


def page(parts: dict[str, str]) -> str:
    photos, tiny = tables(parts[PHOTOS])[0], tables(parts[TINY])[0]
    peers = tables(parts[PEERS])
    defaults = tables(parts[DEFAULTS])[0]
    lines = [
        "# Figures",
        "",
        "Every speed figure the README and these pages give, in one place. Each",
        "table comes from one run in `bench/RESULTS.md`, which has its command,",
        "machine (2 CPU cores, no GPU) and date; `python bench/figures.py`, run",
        "from a checkout of the repository (about a second), makes this page from",
        "it, and the headline below in the README and on the home page. Ratios",
        "are best worker count against best worker count. Runs on other days",
        "differ by more than the rows within a run do.",
        "",
        "## Headline",
        "",
        headline_block(parts, "#photos-decoded-and-resized-to-224224", "the first table"),
        "",
        "## Photos, decoded and resized to 224×224",
        "",
        "| row | samples/s, best of 0 and 2 workers | × the folder |",
        "|---|---|---|",
        *own_rows(photos, [("lmdb", "lmdb"), ("hdf5", "hdf5"), ("tfrecord", "tfrecord"),
                           ("tar", "tar"), ("lmdb, packed `--resize 256`", "lmdb resize256"),
                           ("tar, packed `--resize 256`", "tar resize256"),
                           ("lmdb, pre-decoded (`--encoding raw`)", "lmdb raw (pre-decoded)"),
                           ("tar, pre-decoded (`--encoding raw`)", "tar raw (pre-decoded)")]),
        "",
        f"From {link(PHOTOS)}.",
        "",
        "## 32×32 PNGs",
        "",
        "| row | samples/s, best of 0 and 2 workers | × the folder |",
        "|---|---|---|",
        *own_rows(tiny, [("lmdb", "lmdb"), ("hdf5", "hdf5"), ("tfrecord", "tfrecord"),
                         ("tar", "tar"), ("lmdb, pre-decoded", "lmdb raw (pre-decoded)"),
                         ("tar, pre-decoded", "tar raw (pre-decoded)")]),
        "",
        f"From {link(TINY)}.",
        "",
        "## Against other libraries",
        "",
        comparison(peers),
        "",
        f"From {link(PEERS)}.",
        "Each library with its own writer and reader, PIL decoding for the peers,",
        "non-persistent workers for every row.",
        "",
        "## The defaults against hand-tuned settings",
        "",
        "| row | `loader()` defaults | hand-tuned `loader(num_workers=W)` | defaults / tuned |",
        "|---|---|---|---|",
        *[f"| {r['row']} | {r['defaults (float32)']} | "
          f"{r['hand-tuned `loader(num_workers=W)`']} | {r['defaults / tuned']}× |"
          for r in defaults],
        "",
        f"From {link(DEFAULTS)}.",
        "",
    ]
    return "\n".join(lines)


def comparison(peers: list[list[dict]]) -> str:
    """The table of fastdata against the other libraries (README and page)."""
    photos, tiny = peers[0], peers[1]
    base_p, base_t = peer_best(photos, "folder (PIL)"), peer_best(tiny, "folder (PIL)")
    wds = peer_best(photos, 'webdataset (own pipeline, `.decode("pil")`)')
    rows = [
        "| | fastdata | webdataset | LitData | MosaicML Streaming |",
        "|---|---|---|---|---|",
        f"| 224×224 photos, samples/s (folder + PIL: {fmt(base_p)}) "
        f"| **{fmt(peer_best(photos, 'fastdata tar'))}** (tar shards); "
        f"{fmt(peer_best(photos, 'fastdata lmdb `--resize 256`'))} "
        "(LMDB packed at `--resize 256`) "
        f"| {fmt(wds)} "
        f"| {fmt(peer_best(photos, 'LitData'))} "
        f"| {fmt(peer_best(photos, 'MosaicML Streaming'))} |",
        f"| 32×32 PNGs, samples/s (folder + PIL: {fmt(base_t)}) "
        f"| **{fmt(peer_best(tiny, 'fastdata tar'))}** (tar shards); "
        f"{fmt(peer_best(tiny, 'fastdata lmdb raw'))} (LMDB, pre-decoded) "
        f"| {fmt(peer_best(tiny, 'webdataset'))} | {fmt(peer_best(tiny, 'LitData'))} "
        f"| {fmt(peer_best(tiny, 'MosaicML Streaming'))} |",
        "| installs with pip alone, beside any torch 2.x | yes | yes "
        "| pulls torchvision, which pulls another torch "
        "| needs numpy < 2.2, torchvision and an older filelock |",
    ]
    return "\n".join(rows)


def readme_block(parts: dict[str, str]) -> str:
    """The README's comparison table with the headline, between the figures markers."""
    return "\n".join([
        BEGIN,
        comparison(tables(parts[PEERS])),
        "",
        "Every figure, with its run: [Figures](docs/speed/figures.md).",
        END,
    ])


def between(text: str, begin: str, end: str, body: str, where: Path) -> str:
    """``text`` with what stands from ``begin`` to ``end`` (markers included) replaced by ``body``."""
    if begin not in text or end not in text:
        raise SystemExit(f"bench/figures.py: {where.relative_to(ROOT)} lacks the markers "
                         f"{begin} ... {end}")
    head, rest = text.split(begin, 1)
    return head + body + rest.split(end, 1)[1]


def render() -> dict[Path, str]:
    """The figures page, the README and the home page as RESULTS.md gives them."""
    parts = sections(RESULTS.read_text(encoding="utf-8"))
    for title in (PHOTOS, TINY, PEERS, DEFAULTS):
        if title not in parts:
            raise SystemExit(f"bench/figures.py: bench/RESULTS.md has no section {title!r}")
    readme = README.read_text(encoding="utf-8")
    readme = between(readme, BEGIN, END, readme_block(parts), README)
    readme = between(readme, HEAD_BEGIN, HEAD_END,
                     headline_block(parts, "docs/speed/figures.md"), README)
    home = between(HOME.read_text(encoding="utf-8"), HEAD_BEGIN, HEAD_END,
                   headline_block(parts, "speed/figures.md"), HOME)
    return {PAGE: page(parts), README: readme, HOME: home}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the page, the README or the home page is out of date")
    args = parser.parse_args()
    new = render()
    stale = [p for p, text in new.items()
             if not p.exists() or p.read_text(encoding="utf-8") != text]
    if args.check:
        if stale:
            print("out of date (run python bench/figures.py): "
                  + ", ".join(str(p.relative_to(ROOT)) for p in stale))
            sys.exit(1)
        print("figures are current")
        return
    for path, text in new.items():
        path.write_text(text, encoding="utf-8")
    print("wrote " + ", ".join(str(p.relative_to(ROOT)) for p in new))


if __name__ == "__main__":
    main()
