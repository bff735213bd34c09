"""The demo as a speedrun: bits per byte on its held-out split against general-purpose compressors.

``compressor_bits_per_byte(root)`` compresses the demo's validation split (the Python standard
library's held-out documents, end-of-text markers removed) with ``gzip -9``, ``bz2 -9`` and
``xz -9e`` and reports ``8 x compressed / raw`` bytes; ``demo_bits_per_byte(root, ...)`` runs
``theseus run demo/gpt`` in a fresh process (no samples) and reads the bits per byte of its final
evaluation on the whole split (``evaluation/compression``: every byte predicted once, in order,
from the 64-127 bytes before it: the bytes the compressors code), next to its final
validation (40 random windows). A model that has learned Python should need fewer bits than the
compressors.

Run ``python benchmarks/demo_speedrun.py [key=value ...]`` (overrides of the demo's configuration).
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.first_step import theseus_command

DATASET = "python-stdlib"
COMPRESSORS = {
    "gzip -9": lambda data: gzip.compress(data, 9),
    "bz2 -9": lambda data: bz2.compress(data, 9),
    "xz -9e": lambda data: lzma.compress(data, preset=9 | lzma.PRESET_EXTREME),
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THESEUS_")}
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def prepare(root: Path) -> Path:
    """The byte-level standard-library corpus under ``root`` (prepared once); returns its folder."""
    folder = root / "data" / DATASET
    if not (folder / "val.bin").is_file():
        command = [*theseus_command(), "run", "data/tokenize", f"data/dataset={DATASET}", "--root", str(root)]
        done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"preparing {DATASET} failed: {done.stderr.strip()[-400:]}")
    return folder


def validation_bytes(root: Path) -> bytes:
    """The validation split's bytes (uint16 byte tokens; the end-of-text id 256 dropped)."""
    tokens = np.fromfile(prepare(root) / "val.bin", dtype=np.uint16)
    return tokens[tokens < 256].astype(np.uint8).tobytes()


def compressor_bits_per_byte(root: Path) -> dict[str, float]:
    """``{compressor: bits per byte}`` on the validation split."""
    data = validation_bytes(root)
    return {name: 8.0 * len(compress(data)) / len(data) for name, compress in COMPRESSORS.items()}


def demo_bits_per_byte(
    root: Path, overrides: list[str] | None = None, timeout: float = 3600
) -> tuple[float, float, float]:
    """``(bits per byte of the whole split, of the final validation, wall seconds)`` of ``theseus run demo/gpt``."""
    prepare(root)
    command = [*theseus_command(), "run", "demo/gpt", "--root", str(root), "demo/prompts=[]", *(overrides or [])]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=timeout)
    seconds = time.perf_counter() - start
    validation = re.search(r"= ([0-9.]+) bits/byte", done.stdout)
    whole = re.search(r"whole validation split .*: ([0-9.]+) bits/byte", done.stdout)
    if done.returncode != 0:
        raise RuntimeError(f"demo/gpt failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-400:]}")
    if validation is None or whole is None:
        raise RuntimeError(f"demo/gpt printed no validation or whole-split bits/byte: {done.stdout.strip()[-400:]}")
    return float(whole.group(1)), float(validation.group(1)), seconds


def main(argv: list[str] | None = None) -> None:
    overrides = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory(prefix="theseus-speedrun-") as tmp:
        root = Path(tmp)
        for name, bits in compressor_bits_per_byte(root).items():
            print(f"{name:8s} {bits:.3f} bits/byte")
        bits, validation, seconds = demo_bits_per_byte(root, overrides)
        print(
            f"demo/gpt {bits:.3f} bits/byte on the whole split (final validation on random windows: "
            f"{validation:.3f}) in {seconds:.0f} s ({' '.join(overrides) or 'defaults'})"
        )
        print(f"(uniform bytes: {math.log2(256):.0f} bits/byte)")


if __name__ == "__main__":
    main()
