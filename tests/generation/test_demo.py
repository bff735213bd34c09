"""``theseus run demo/gpt`` end to end (test-sized) in a subprocess, then once more."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import run_cli

#: A one-layer, 32-wide model over 64 positions for 30 steps: the demo's whole path in seconds.
SMALL = [
    "architecture/n_layers=1",
    "architecture/n_embd=32",
    "architecture/n_heads=2",
    "architecture/block_size=64",
    "training/sequence_length=64",
    "training/steps=30",
    "training/batch_size=8",
    "training/lr=1e-2",
    "training/eval_interval=15",
    "training/eval_batches=2",
    "training/checkpoint_interval=15",
    "training/log_interval=5",
    "training/peak_flops=1e12",
    "demo/max_new_tokens=24",
    "evaluation/compression/max_tokens=16384",
]


def validation_losses(run_dir: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if r["split"] == "val"]


@pytest.mark.slow
def test_demo_trains_checkpoints_plots_and_writes(tmp_path: Path) -> None:
    result = run_cli(["run", "demo/gpt", "--root", str(tmp_path), *SMALL], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "data" / "python-stdlib" / "header.json").is_file()  # the corpus was prepared
    run_dir = tmp_path / "runs" / "demo-gpt"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) == ["15", "30"]
    assert (run_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    losses = validation_losses(run_dir)
    assert [step for step, _ in losses] == [15, 30]
    final = losses[-1][1]
    assert final < math.log(256)  # better than uniform bytes
    out = result.stdout
    assert f"validation at step 30: loss {final:.4f} nats/byte = {final / math.log(2):.3f} bits/byte" in out
    # the whole validation split, scored once at the end, as a compressor codes it
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (whole,) = [r for r in records if r["split"] == "eval"]
    assert whole["step"] == 30 and whole["compression/targets"] >= whole["compression/bytes"] > 10_000
    bits, size = whole["compression/bits_per_byte"], whole["compression/bytes"]
    assert abs(bits - final / math.log(2)) < 0.5  # the same model on more of the same bytes
    assert f"whole validation split ({size:,} bytes, each predicted once, in order): {bits:.3f} bits/byte" in out
    assert "samples from step 30" in out
    for prompt in ("def ", "import ", "class "):
        assert f"----- {prompt!r} -----\n{prompt}" in out
    assert f"theseus run generate --root {tmp_path} generate/run=demo-gpt" in out

    # a second run trains nothing: it reports the run complete and writes the same samples again
    metrics = (run_dir / "metrics.jsonl").read_text()
    again = run_cli(["run", "demo/gpt", "--root", str(tmp_path), *SMALL], timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already completed (30/30 steps)" in again.stderr
    assert again.stdout == out
    assert (run_dir / "metrics.jsonl").read_text() == metrics


def test_demo_defaults_fit_byte_data() -> None:
    from theseus.config import Schema
    from theseus.model.demo import DemoGPT

    schema = Schema.build(DemoGPT.config())
    trainer = DemoGPT.create(Path("unused"), {})
    assert trainer.setting("architecture/vocab_size") == 257  # the generic 256 raised for end-of-text
    assert trainer.setting("architecture/n_layers") == 2
    assert trainer.setting("architecture/n_heads") == 2 and trainer.setting("architecture/vocab_multiple") == 1
    assert DemoGPT.MODEL.FAMILY == "Llama" and trainer.setting("architecture/n_kv_heads") == 1
    schedule = DemoGPT.schedule()
    assert schedule is not None and schedule.name == "wsd"
    assert trainer.run_name == "demo-gpt"
    chosen = DemoGPT.create(Path("unused"), {"architecture/vocab_size": 300, "architecture/n_layers": 4})
    assert chosen.setting("architecture/vocab_size") == 300 and chosen.setting("architecture/n_layers") == 4
    assert schema["training/batch_size"].default == trainer.args.batch_size == 8
    assert DemoGPT.optimizer().name == "muon" and [e.name for e in DemoGPT.EVALUATION] == ["compression"]
    assert (
        trainer.setting("optimizer/muon/weight_decay") == 0.0 and trainer.setting("schedule/wsd/decay_fraction") == 0.4
    )
    adamw = DemoGPT.create(Path("unused"), {"select/optimizer": "adamw"})  # Muon's keys leave with Muon
    assert adamw.setting("optimizer/muon/weight_decay") is None
    assert trainer.args.prompts == ["def ", "import ", "class "]
