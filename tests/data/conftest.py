"""Data test helpers: offline Hugging Face settings, tiny prepared datasets, FineWeb-shaped parquet files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

# Tests never touch the network: make Hugging Face libraries fail fast instead of trying.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from theseus.data.format import Prepared, PreparedWriter

#: FineWeb's real column schema (HuggingFaceFW/fineweb parquet files).
FINEWEB_COLUMNS = (
    "text",
    "id",
    "dump",
    "url",
    "date",
    "file_path",
    "language",
    "language_score",
    "token_count",
)


def write_prepared(
    root: Path,
    name: str,
    splits: dict[str, Sequence[Sequence[int]]],
    *,
    vocab_size: int = 1000,
    eot_id: int | None = None,
    prompts: dict[str, Sequence[int]] | None = None,
    style: str = "pmd",
    tokenizer: dict | None = None,
) -> Prepared:
    """Write documents (token lists, end-of-text appended here) as prepared data ``name``."""
    eot = vocab_size - 1 if eot_id is None else eot_id
    with PreparedWriter(root, name, vocab_size=vocab_size, eot_id=eot) as writer:
        for split, docs in splits.items():
            writer.open_split(split)
            if not docs:
                continue
            tokens = np.concatenate([np.append(np.asarray(d, dtype=np.int64), eot) for d in docs])
            lengths = np.asarray([len(d) + 1 for d in docs])
            plens = np.asarray((prompts or {}).get(split, [0] * len(docs)))
            writer.append(split, tokens, lengths, plens)
        return writer.commit(tokenizer=tokenizer or {"kind": "test", "vocab": vocab_size}, style=style)


def fineweb_rows(count: int, seed: int = 0) -> list[dict]:
    """Rows shaped like FineWeb's, with varied (partly non-ASCII) text."""
    rng = np.random.default_rng(seed)
    words = ["the", "model", "learns", "données", "über", "数据", "tokens", "web", "page", "🙂", "and", "of"]
    rows = []
    for i in range(count):
        text = " ".join(rng.choice(words, size=int(rng.integers(3, 40)))) + ("\n" if i % 3 == 0 else ".")
        rows.append(
            {
                "text": text,
                "id": f"<urn:uuid:{i:08d}-0000-0000-0000-000000000000>",
                "dump": "CC-MAIN-2024-10",
                "url": f"https://example.com/{i}",
                "date": "2024-02-20T12:00:00Z",
                "file_path": f"s3://commoncrawl/crawl-data/CC-MAIN-2024-10/segments/{i}.warc.gz",
                "language": "en",
                "language_score": float(rng.uniform(0.65, 1.0)),
                "token_count": len(text.split()),
            }
        )
    return rows


def write_fineweb_parquet(folder: Path, rows: list[dict], files: int = 2) -> list[Path]:
    """Split ``rows`` over ``files`` parquet files named like FineWeb's (``000_00000.parquet``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("text", pa.string()),
            ("id", pa.string()),
            ("dump", pa.string()),
            ("url", pa.string()),
            ("date", pa.string()),
            ("file_path", pa.string()),
            ("language", pa.string()),
            ("language_score", pa.float64()),
            ("token_count", pa.int64()),
        ]
    )
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-len(rows) // files)
    paths = []
    for f in range(files):
        part = rows[f * per : (f + 1) * per]
        table = pa.Table.from_pylist(part, schema=schema)
        path = folder / f"{f:03d}_00000.parquet"
        pq.write_table(table, path)
        paths.append(path)
    return paths


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path
