"""Selecting components by name on a core job from the command line (in one process, tiny runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from theseus.cli.main import main
from theseus.training.schedules import WSD, Constant, Cosine, Linear

pytestmark = pytest.mark.slow

#: One layer, 32 wide, 3 steps of 4 x 32 bytes; no validation, evaluation or checkpoints in between.
TINY = [
    "architecture/n_layers=1",
    "architecture/n_embd=32",
    "architecture/n_heads=2",
    "architecture/block_size=32",
    "training/batch_size=4",
    "training/steps=3",
    "training/lr=3e-3",
    "training/log_interval=1",
    "training/eval_batches=0",
    "training/checkpoint_interval=0",
    "training/async_checkpoints=false",
    "training/progress=false",
    "training/plots=false",
    "training/compilation_cache=false",
    "training/peak_flops=1e12",
    "evaluation=",
]


def theseus(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in this process; returns (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("select-root")
    texts = tmp_path_factory.mktemp("texts")
    for index in range(6):
        (texts / f"doc{index}.txt").write_text(f"document {index}: " + "the quick brown fox " * 20)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        for args in (
            ["data/max_documents=16", "data/val_fraction=0.125", "data/workers=1"],
            ["data/dataset=local", f"data/local/path={texts}", "data/val_fraction=0.2", "data/workers=1"],
        ):
            try:
                main(["run", "data/tokenize", *args, "--root", str(root)])
            except SystemExit as exc:  # pragma: no cover - only on failure
                raise AssertionError(f"data/tokenize {args} failed ({exc.code})") from exc
    return root


def train(capsys: pytest.CaptureFixture[str], root: Path, name: str, *selection: str) -> dict[str, Any]:
    code, _out, err = theseus(
        capsys, "run", "train/pretrain", *TINY, f"run/name={name}", *selection, "--root", str(root)
    )
    assert code == 0, f"{selection}: {err}"
    run = root / "runs" / name
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["split"] == "train"]
    return {
        "loss": [r["loss"] for r in train_records],
        "lr": [r["lr"] for r in train_records],
        "config": (run / "config.yaml").read_text(),
        "provenance": json.loads((run / "provenance.json").read_text()),
    }


def test_every_builtin_optimizer_and_schedule_selected_from_the_cli(
    capsys: pytest.CaptureFixture[str], root: Path
) -> None:
    base = train(capsys, root, "adamw")
    assert base["provenance"]["selection"]["optimizer"] == "adamw"
    assert base["lr"] == pytest.approx([float(WSD.create(3e-3, 3)(s)) for s in range(3)])
    # Each optimizer with another schedule: the schedule sets the recorded lr, the optimizer the losses.
    for optimizer, schedule, expected in (
        ("lion", "cosine", Cosine),
        ("sgd", "linear", Linear),
        ("muon", "constant", Constant),
    ):
        run = train(capsys, root, optimizer, f"optimizer={optimizer}", f"schedule={schedule}")
        assert run["lr"] == pytest.approx([float(expected.create(3e-3, 3)(s)) for s in range(3)]), schedule
        assert run["loss"][0] == pytest.approx(base["loss"][0])  # same initialisation and data
        assert run["loss"][1:] != pytest.approx(base["loss"][1:], rel=1e-4), optimizer  # a different update
        assert f"optimizer: {optimizer}" in run["config"] and f"  {optimizer}:" in run["config"]
        assert "adamw" not in run["config"].replace("optimizer: adamw", "")
        assert run["provenance"]["selection"]["optimizer"] == optimizer
        assert run["provenance"]["selection"]["schedule"] == schedule

    # A changed selection on resume is one line naming both; the run is left as it was.
    before = (root / "runs" / "adamw" / "config.yaml").read_text()
    code, _, err = theseus(
        capsys,
        "run",
        "train/pretrain",
        *TINY,
        "run/name=adamw",
        "training/steps=4",
        "training/checkpoint_interval=1",
        "optimizer=lion",
        "--root",
        str(root),
    )
    assert code == 2 and err.splitlines() == [
        "error: run 'adamw' was started with optimizer='adamw'; this run selects optimizer='lion'; "
        "resume with optimizer=adamw, or start a new run with run/name=<new name>"
    ]
    assert (root / "runs" / "adamw" / "config.yaml").read_text() == before


def test_llama_on_a_gpt_job_with_a_data_mixture(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    run = train(capsys, root, "llama-mix", "model=llama", "dataset=python-stdlib:0.75,local:0.25:padded")
    assert run["provenance"]["model"] == "theseus.model.models.llama.model:Llama"
    assert run["provenance"]["selection"]["dataset"] == "python-stdlib:0.75,local:0.25:padded"
    assert "rope_theta" in run["config"] and "model: llama" in run["config"]
    assert len(run["loss"]) == 3

    from theseus.training.pretrain import Pretrain

    trainer = Pretrain.create(root, [*TINY, "model=llama", "dataset=python-stdlib:0.75,local:0.25:padded"])
    trainer.setup()
    try:
        strategy = trainer.flywheel.strategy
        assert [(s.name, s.rate, s.style) for s in strategy] == [
            ("python-stdlib", 0.75, None),
            ("local", 0.25, "padded"),
        ]
        batch = trainer.host_batch("train", position=0)
        assert batch["x"].shape == (4, 32)
    finally:
        trainer.close()
    assert type(trainer).__qualname__ == "Pretrain" and type(trainer).MODEL is not Pretrain.MODEL
