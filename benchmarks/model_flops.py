"""``model.flops(seq)`` of every installed model family's presets at a few sequence lengths.

Prints one line per (model, preset, variant, seq) as JSON, or, with ``--compare FILE``, only the
entries that differ from a table written earlier (``--out FILE``), with the ratio. The counts are
analytic (no parameters are allocated), so every preset, the largest included, takes milliseconds.

    python benchmarks/model_flops.py --out /tmp/flops-before.json
    python benchmarks/model_flops.py --compare /tmp/flops-before.json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

#: The sequence lengths counted; the block size is the largest, so every window and chunk shorter
#: than it binds at the longer lengths.
SEQS = (256, 2048, 8192)
BLOCK_SIZE = 8192

#: Extra keys per model that switch on a layer kind the defaults leave out.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "deepseek_v3": {"mtp1": {"architecture/mtp_depth": 1}},
    "llama": {"window1024": {"architecture/sliding_window": 1024}},
}


def models() -> dict[str, type]:
    from theseus.plugins.discovery import plugins

    return {entry.name: entry.load() for entry in plugins().registry.components_of("model")}


def table() -> dict[str, int]:
    from theseus.config import configuration, configure

    counts: dict[str, int] = {}
    for name, cls in sorted(models().items()):
        for preset in getattr(cls, "PRESETS", {}) or {"default": None}:
            variants = {"": {}, **VARIANTS.get(name, {})}
            for variant, extra in variants.items():
                keys = {"architecture/block_size": BLOCK_SIZE, **extra}
                if preset != "default":
                    keys["architecture/preset"] = preset
                with configuration(keys):
                    model = configure(cls)
                for seq in SEQS:
                    counts[f"{name}/{preset}{'/' + variant if variant else ''}@{seq}"] = int(model.flops(seq))
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the table here (JSON)")
    parser.add_argument("--compare", help="print only the entries that differ from this table")
    args = parser.parse_args(argv)
    counts = table()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(counts, f, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        changed = 0
        for key in sorted(set(before) | set(counts)):
            old, new = before.get(key), counts.get(key)
            if old != new:
                changed += 1
                ratio = f"{new / old:.4f}" if old and new else "-"
                print(f"{key:60s} {old!s:>22} -> {new!s:>22}  x{ratio}")
        print(f"{changed} of {len(counts)} differ")
        return 0
    for key, value in counts.items():
        print(f"{key:60s} {value:>22,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
