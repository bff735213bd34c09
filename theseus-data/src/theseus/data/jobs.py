"""Jobs: ``data/tokenize`` prepares a dataset under the root; ``data/train-bpe`` trains a BPE tokenizer."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import click

from theseus.base.job import Job
from theseus.config import field
from theseus.data.datasets.base import TRAIN, dataset_classes
from theseus.data.format import HEADER_FILE, Prepared, data_folder
from theseus.data.prepare import as_dataset, check_existing, prepare
from theseus.data.tokenizers.spec import load_tokenizer, tokenizer_field


@dataclass
class TokenizeConfig:
    """What ``data/tokenize`` prepares, with which tokenizer, and where."""

    dataset: str = field("data/dataset", default="python-stdlib", help="registered dataset name")
    tokenizer: str = tokenizer_field()
    name: str = field("data/name", default="", help="prepared folder <root>/data/<name> (default: dataset name)")
    force: bool = field("data/force", default=False, help="re-prepare even if the data already exists")
    workers: int = field("data/workers", default=0, help="tokenizer processes (0: automatic)")
    commit_seconds: float = field(
        "data/commit_seconds",
        default=10.0,
        help="commit finished chunks at most this often; a killed run continues from the last commit (0: every chunk)",
    )


def _summary(prepared: Prepared) -> str:
    h = prepared.header
    splits = ", ".join(f"{k} {v.tokens:,} tokens / {v.documents:,} documents" for k, v in h.splits.items())
    return f"{h.name}: {splits} ({h.dtype}, vocabulary {h.vocab_size}) in {prepared.folder}"


class Tokenize(Job):
    """Tokenize a dataset into ``<root>/data/<name>/`` (train/val token shards + header.json).

    ``theseus run data/tokenize data/dataset=python-stdlib --root DIR``; a second run is a no-op
    unless ``data/force=true``.
    """

    CONFIG = TokenizeConfig

    @classmethod
    def config(cls) -> list[type]:
        return [TokenizeConfig, *dataset_classes()]

    def run(self) -> None:
        args: TokenizeConfig = self.args
        root = self.context.root
        dataset = as_dataset(args.dataset)
        name = args.name or dataset.name
        folder = data_folder(root, name)
        if not args.force and (folder / HEADER_FILE).is_file():
            existing = Prepared(folder)
            hint = f"'theseus run data/tokenize data/dataset={args.dataset}'"
            check_existing(existing, dataset, load_tokenizer(args.tokenizer), hint)
            click.echo(f"already prepared {_summary(existing)}; pass data/force=true to prepare again")
            return
        start = time.perf_counter()
        prepared = prepare(
            dataset,
            root,
            tokenizer=args.tokenizer,
            name=name,
            workers=args.workers,
            force=True,
            progress=True,
            commit_seconds=args.commit_seconds,
        )
        click.echo(f"prepared {_summary(prepared)} in {time.perf_counter() - start:.1f}s")


@dataclass
class TrainBPEConfig:
    """Which dataset a BPE tokenizer learns from, its size, and where it is written."""

    dataset: str = field("data/dataset", default="python-stdlib", help="registered dataset name")
    vocab_size: int = field("data/bpe/vocab_size", default=4096, help="vocabulary size, end-of-text included")
    min_frequency: int = field("data/bpe/min_frequency", default=2, help="least count of a pair to merge")
    out: str = field("data/bpe/out", default="", help="output tokenizer.json (default <root>/tokenizers/...)")
    force: bool = field("data/force", default=False, help="train again even if the file exists")


class TrainBPE(Job):
    """Train a byte-level BPE on a dataset's train split and write a ``tokenizer.json``.

    Then prepare data with it: ``theseus run data/tokenize data/tokenizer=hf:PATH ...``.
    """

    CONFIG = TrainBPEConfig

    @classmethod
    def config(cls) -> list[type]:
        return [TrainBPEConfig, *dataset_classes()]

    def run(self) -> None:
        from theseus.data.tokenizers.bpe import train_bpe

        args: TrainBPEConfig = self.args
        root = self.context.root
        dataset = as_dataset(args.dataset)
        out = (
            Path(args.out).expanduser()
            if args.out
            else root / "tokenizers" / f"{dataset.name}-bpe-{args.vocab_size}.json"
        )
        command = f"theseus run data/tokenize data/dataset={args.dataset} data/tokenizer=hf:{out} --root {root}"
        if out.is_file() and not args.force:
            click.echo(f"already trained {out}; pass data/force=true to train again. Prepare data with: {command}")
            return
        start = time.perf_counter()
        texts = (doc.prompt + doc.text for doc in dataset.documents() if doc.split == TRAIN)
        train_bpe(texts, out, vocab_size=args.vocab_size, min_frequency=args.min_frequency)
        tokenizer = load_tokenizer({"kind": "hf", "path": str(out)})
        click.echo(
            f"trained a BPE with {tokenizer.vocab_size} tokens on {dataset.name!r} in "
            f"{time.perf_counter() - start:.1f}s: {out}\nprepare data with: {command}"
        )
