"""Rebuild ``train.csv`` and ``validation.csv`` (movie-review sentence polarity) from their public source.

Source: the sdist of the PyPI package ``vaderSentiment==3.3.2`` (MIT licence)
ships ``additional_resources/hutto_ICWSM_2014.tar.gz``, the data set of
Hutto & Gilbert (ICWSM 2014). Its ``movieReviewSnippets_GroundTruth.txt``
holds 10,605 real sentences from Rotten Tomatoes reviews (the Pang & Lee
snippets) with the mean sentiment rating of at least 20 human raters
(-4 extremely negative ... +4 extremely positive). Nothing here is labelled
by a model: the label is the sign of the raters' mean.

What this script does, deterministically:

1. ``pip download --no-deps --no-binary :all: vaderSentiment==3.3.2`` (or
   ``--sdist PATH`` to use a copy you have) and check its SHA-256;
2. read the movie snippets, drop the ones whose mean rating is weaker than
   ``--min_abs_rating`` (1.0: keep clearly positive / clearly negative
   sentences, as SST-2 drops the neutral ones) and exact duplicate texts;
3. label ``1`` for a positive mean rating, ``0`` for a negative one;
4. draw a balanced sample with a fixed seed and split it into
   ``--train_size`` and ``--validation_size`` rows (half of each label in each);
5. write ``label,sentence`` CSV files (UTF-8, header row, RFC 4180 quoting).

Run from anywhere::

    python examples/data/build_dataset.py            # rewrites examples/data/{train,validation}.csv
    python examples/data/build_dataset.py --check    # rebuilds in memory, fails if the files differ
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import random
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SDIST_NAME = "vaderSentiment-3.3.2.tar.gz"
SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
INNER_ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
SNIPPETS = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, default=None, help=f"a local {SDIST_NAME} (default: pip download it)")
    parser.add_argument("--out_dir", type=Path, default=HERE, help="where to write the CSV files (default: here)")
    parser.add_argument("--min_abs_rating", type=float, default=1.0,
                        help="keep sentences whose |mean rating| is at least this (default: 1.0)")
    parser.add_argument("--train_size", type=int, default=2400, help="training rows, balanced (default: 2400)")
    parser.add_argument("--validation_size", type=int, default=600, help="validation rows, balanced (default: 600)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample and the split (default: 0)")
    parser.add_argument("--check", action="store_true", help="do not write: fail if the files on disk differ")
    return parser.parse_args(argv)


def fetch_sdist(path: Path | None, workdir: Path) -> bytes:
    if path is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        "vaderSentiment==3.3.2", "-d", str(workdir)], check=True)
        path = workdir / SDIST_NAME
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{path}: SHA-256 {digest}, expected {SDIST_SHA256}")
    return data


def read_snippets(sdist: bytes) -> list[tuple[float, str]]:
    with tarfile.open(fileobj=io.BytesIO(sdist)) as outer:
        inner_bytes = outer.extractfile(INNER_ARCHIVE).read()
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        text = inner.extractfile(SNIPPETS).read().decode("utf-8")
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        _id, rating, sentence = line.split("\t")
        rows.append((float(rating), " ".join(sentence.split())))
    return rows


def build(snippets: list[tuple[float, str]], args: argparse.Namespace) -> dict[str, list[tuple[int, str]]]:
    seen: set[str] = set()
    by_label: dict[int, list[str]] = {0: [], 1: []}
    for rating, sentence in snippets:
        if abs(rating) < args.min_abs_rating or not sentence or sentence in seen:
            continue
        seen.add(sentence)
        by_label[int(rating > 0)].append(sentence)
    rng = random.Random(args.seed)
    splits: dict[str, list[tuple[int, str]]] = {"train": [], "validation": []}
    for label, sentences in by_label.items():
        need = (args.train_size + args.validation_size) // 2
        if len(sentences) < need:
            raise SystemExit(f"only {len(sentences)} sentences with label {label}, need {need}")
        chosen = rng.sample(sentences, need)
        splits["validation"] += [(label, s) for s in chosen[: args.validation_size // 2]]
        splits["train"] += [(label, s) for s in chosen[args.validation_size // 2:]]
    for rows in splits.values():
        rng.shuffle(rows)
    return splits


def to_csv(rows: list[tuple[int, str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["label", "sentence"])
    writer.writerows(rows)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        splits = build(read_snippets(fetch_sdist(args.sdist, Path(tmp))), args)
    status = 0
    for name, rows in splits.items():
        path = args.out_dir / f"{name}.csv"
        content = to_csv(rows)
        if args.check:
            same = path.exists() and path.read_text(encoding="utf-8") == content
            print(f"{path}: {'up to date' if same else 'DIFFERS'}")
            status |= not same
        else:
            path.write_text(content, encoding="utf-8")
            positives = sum(label for label, _ in rows)
            print(f"wrote {path}: {len(rows)} rows ({positives} positive, {len(rows) - positives} negative)")
    return status


if __name__ == "__main__":
    sys.exit(main())
