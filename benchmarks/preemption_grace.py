"""Grace time of a preemption: from SIGTERM to the exit line, with the checkpoint written.

    python benchmarks/preemption_grace.py [--presets tiny small gpt2-124m] [--batch 4] [--seq 128]

For each GPT preset, prepares the offline corpus (byte tokens) once, then runs
``theseus run train/pretrain`` in a subprocess that sends itself SIGTERM while update 3 runs
(``THESEUS_TEST_KILL_AT=step:3:TERM``). The run finishes that update, writes a checkpoint and exits
75 with ``... stopped at step 3/... with a checkpoint X s after the signal``; X is the grace time a
scheduler must allow. Printed next to it: the step time of the same run and the checkpoint's size.
With several processes add two step times (the stop step is agreed two updates ahead).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.first_step import _env, theseus_command

GRACE = re.compile(r"stopped at step (\d+)/\d+ with a checkpoint ([0-9.]+) s after the signal")


def measure(root: Path, preset: str, batch: int, seq: int) -> dict[str, object]:
    """Run ``preset`` until the self-sent SIGTERM; the grace seconds, step time and checkpoint bytes."""
    name = f"grace-{preset}"
    env = _env()
    env["THESEUS_TEST_KILL_AT"] = "step:3:TERM"
    command = [
        *theseus_command(),
        "run",
        "train/pretrain",
        "--root",
        str(root),
        f"architecture/preset={preset}",
        "architecture/vocab_size=260",
        f"architecture/block_size={seq}",
        f"training/batch_size={batch}",
        "training/steps=100",
        "training/log_interval=1",
        "training/eval_batches=0",
        "training/checkpoint_interval=0",
        "training/progress=false",
        "training/compilation_cache=false",
        f"run/name={name}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    found = GRACE.search(done.stderr)
    if done.returncode != 75 or found is None:
        raise RuntimeError(f"{preset}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    run = root / "runs" / name
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step_times = [row["step_time"] for row in rows if row.get("split") == "train" and "step_time" in row]
    checkpoint = run / "checkpoints" / found.group(1)
    size = sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
    return {
        "preset": preset,
        "grace_s": float(found.group(2)),
        "step_s": step_times[-1] if step_times else float("nan"),
        "checkpoint_mb": size / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small", "gpt2-124m"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prepare = [*theseus_command(), "run", "data/tokenize", "data/max_documents=200", "--root", str(root)]
        subprocess.run(prepare, check=True, capture_output=True, env=_env(), timeout=600)
        print("| preset | step (s) | checkpoint (MB) | SIGTERM -> checkpointed exit (s) |")
        print("|---|---|---|---|")
        for preset in args.presets:
            row = measure(root, preset, args.batch, args.seq)
            print(f"| {row['preset']} | {row['step_s']:.2f} | {row['checkpoint_mb']:.0f} | {row['grace_s']:.1f} |")


if __name__ == "__main__":
    main()
