"""Tokenization throughput: byte-level and BPE, raw and through ``prepare()`` (the tokenize job).

    python benchmarks/data_tokenize.py [--max-documents 300] [--bpe-vocab 4096]

Corpus: the Python standard library (offline). Rows, measured side by side in one run:

* ``raw``: the tokenizer alone over every document in this process (the BPE uses the Rust batch
  encoder with its own threads);
* ``prepare wN``: the whole tokenize job (read files, tokenize, write shards + header) with N
  tokenizer processes (w1 = in this process).

``vs raw`` compares each ``prepare`` row with the raw tokenizer speed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from theseus.data.datasets import PythonStdlib
from theseus.data.prepare import prepare
from theseus.data.tokenizers.base import encode_arrays
from theseus.data.tokenizers.bpe import train_bpe
from theseus.data.tokenizers.byte import ByteTokenizer
from theseus.data.tokenizers.spec import load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-documents", type=int, default=300)
    parser.add_argument("--bpe-vocab", type=int, default=4096)
    args = parser.parse_args()
    dataset = PythonStdlib(max_documents=args.max_documents, val_fraction=0.01)
    texts = [d.text for d in dataset.documents()]
    chars = sum(len(t) for t in texts)
    print(f"corpus: {len(texts)} stdlib files, {chars / 1e6:.1f}M characters")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        bpe_path = train_bpe(texts, root / "bpe.json", vocab_size=args.bpe_vocab)
        print(f"trained BPE ({args.bpe_vocab} tokens) in {time.perf_counter() - start:.1f}s")
        tokenizers = {"byte": ByteTokenizer(), f"bpe-{args.bpe_vocab}": load_tokenizer(f"hf:{bpe_path}")}
        print(
            f"{'tokenizer':<12}{'path':<14}{'tokens':>12}{'seconds':>9}{'tokens/s':>12}{'MB text/s':>11}{'vs raw':>8}"
        )
        for label, tok in tokenizers.items():
            start = time.perf_counter()
            tokens = sum(a.size for a in encode_arrays(tok, texts))
            raw_s = time.perf_counter() - start
            raw = tokens / raw_s
            mb_s = chars / raw_s / 1e6
            print(f"{label:<12}{'raw':<14}{tokens:>12,}{raw_s:>9.2f}{raw / 1e6:>11.2f}M{mb_s:>11.1f}{1:>7.2f}x")
            for workers in (1, 2):
                start = time.perf_counter()
                prepared = prepare(dataset, root, tokenizer=tok, name=f"{label}-w{workers}", workers=workers)
                secs = time.perf_counter() - start
                n = prepared.header.total_tokens
                rate = n / secs
                print(
                    f"{label:<12}{f'prepare w{workers}':<14}{n:>12,}{secs:>9.2f}{rate / 1e6:>11.2f}M"
                    f"{chars / secs / 1e6:>11.1f}{rate / raw:>7.2f}x"
                )


if __name__ == "__main__":
    main()
