"""Batch assembly from memory-mapped shards: tokens/s of ``Flywheel`` next to a bare memcpy.

    python benchmarks/data_loader.py [--tokens 50_000_000] [--seconds 2]

Writes a synthetic prepared dataset (uint16 tokens) to a temporary root, warms the page cache, then
measures, side by side in one run:

* ``memcpy``: copying the same number of contiguous tokens and widening them to int32 (a floor no
  loader can beat);
* ``pmd``: ``Flywheel.assemble`` (random windows, x/y/padding_mask), one source;
* ``pmd mix``: two sources mixed 0.7/0.3;
* ``padded``: one document per row;
* ``prefetched``: ``Flywheel.batch`` with the background thread, as a trainer calls it.

Goal: ``pmd`` >= 50M tokens/s, so the loader is never the bottleneck of training.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from theseus.data.format import PreparedWriter
from theseus.training.flywheel import Flywheel, Sampling

GOAL = 50e6


def write_synthetic(root: Path, name: str, tokens: int, vocab: int = 50257, doc_len: int = 2048) -> None:
    rng = np.random.default_rng(0)
    with PreparedWriter(root, name, vocab_size=vocab, eot_id=vocab - 1) as writer:
        for split, count in (("train", tokens), ("val", max(tokens // 100, 100_000))):
            done = 0
            while done < count:
                n = min(1 << 22, count - done)
                ids = rng.integers(0, vocab - 1, size=n, dtype=np.int64)
                docs = max(1, n // doc_len)
                lengths = np.full(docs, n // docs, dtype=np.int64)
                lengths[-1] += n - int(lengths.sum())
                ids[np.cumsum(lengths) - 1] = vocab - 1
                writer.append(split, ids, lengths, np.zeros(docs, dtype=np.int64))
                done += n
        writer.commit(tokenizer={"kind": "synthetic", "vocab": vocab})


def rate(fn: Callable[[int], object], tokens_per_call: int, seconds: float) -> float:
    fn(0)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn(calls)
        calls += 1
    return calls * tokens_per_call / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=50_000_000)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_synthetic(root, "bench-a", args.tokens)
        write_synthetic(root, "bench-b", args.tokens // 4)
        mm = np.memmap(root / "data" / "bench-a" / "train.bin", dtype=np.uint16, mode="r")
        _ = int(np.asarray(mm[::4096]).sum())  # touch every page once
        print(f"{'config':<22}{'B x T':>12}{'tokens/s':>14}{'vs memcpy':>11}{'vs goal':>9}")
        for b, t in ((8, 1024), (64, 1024), (16, 4096)):
            n = b * t

            def memcpy(step: int, n: int = n) -> np.ndarray:
                start = (step * 7919 * 1024) % (mm.size - n)
                return np.asarray(mm[start : start + n], dtype=np.int32)

            base = rate(memcpy, n, args.seconds)
            runs = {
                "pmd": Flywheel(Sampling("bench-a"), root=root, block_size=t, batch_size=b, prefetch=0),
                "pmd mix 0.7/0.3": Flywheel(
                    [Sampling("bench-a", 0.7), Sampling("bench-b", 0.3)],
                    root=root,
                    block_size=t,
                    batch_size=b,
                    prefetch=0,
                ),
                "padded": Flywheel(
                    Sampling("bench-a", 1.0, "padded"), root=root, block_size=min(t, 2000), batch_size=b, prefetch=0
                ),
            }
            print(f"{'memcpy + int32':<22}{f'{b}x{t}':>12}{base / 1e6:>12.1f}M{1.0:>10.2f}x{base / GOAL:>8.1f}x")
            for label, fw in runs.items():
                r = rate(fw.assemble, b * fw.block_size, args.seconds)
                print(f"{label:<22}{f'{b}x{fw.block_size}':>12}{r / 1e6:>12.1f}M{r / base:>10.2f}x{r / GOAL:>8.1f}x")
                fw.close()
            with Flywheel(Sampling("bench-a"), root=root, block_size=t, batch_size=b, prefetch=2) as fw:
                r = rate(fw.batch, n, args.seconds)
            print(f"{'pmd prefetched':<22}{f'{b}x{t}':>12}{r / 1e6:>12.1f}M{r / base:>10.2f}x{r / GOAL:>8.1f}x")


if __name__ == "__main__":
    main()
