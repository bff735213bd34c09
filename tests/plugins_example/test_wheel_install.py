"""The example plugin as a user installs it: wheels of the four distributions in a fresh venv.

No editable installs and no source tree on the path: from that venv the example's jobs are
listed, its hooks are shown, and one of its jobs trains on data prepared with the same venv.
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DISTRIBUTIONS, REPO, TINY_GPT, clean_env, make_venv, pip_install, run_cli

pytestmark = pytest.mark.slow

EXAMPLE = "theseus-plugins-example"
JOBS = [
    "example/gpt/train",
    "example/gpt/ignore-first-target",
    "example/gpt/logit-rms",
    "example/gpt/step-metrics",
    "example/gpt/deterministic-inspection",
]
#: A one-layer, 32-wide model, 2 steps of 4 x 32 bytes, validation/evaluation/analysis at the end.
TINY = [
    *TINY_GPT,
    "training/steps=2",
    "training/log_interval=1",
    "training/eval_batches=1",
    "training/checkpoint_interval=0",
    "training/async_checkpoints=false",
    "evaluation/next_token/batches=1",
]


@pytest.fixture(scope="module")
def venv_python(wheelhouse: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = make_venv(tmp_path_factory.mktemp("example-venv"), inherit="packages")
    pip_install(python, *(wheelhouse[d] for d in DISTRIBUTIONS))
    return python


def cli(python: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = run_cli(args, python=python, cwd=cwd, env=clean_env())
    assert done.returncode == 0, f"theseus {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def test_the_example_comes_from_the_wheel(venv_python: Path, tmp_path: Path) -> None:
    code = "import theseus_plugins_example.trainers as t, importlib.metadata as m\nprint(t.__file__)\n"
    code += "print(m.distribution('theseus-plugins-example').read_text('direct_url.json') or 'no direct url')"
    done = subprocess.run([str(venv_python), "-c", code], capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    location, direct_url = done.stdout.splitlines()[:2]
    assert location.startswith(str(venv_python.parents[1])) and str(REPO) not in location
    assert '"editable": true' not in direct_url


def test_jobs_and_plugins_list_the_example(venv_python: Path, tmp_path: Path) -> None:
    jobs = cli(venv_python, ["jobs"], tmp_path).stdout
    for job in JOBS:
        assert any(line.split() == [job, EXAMPLE, "0.1.0"] for line in jobs.splitlines()), jobs
    listed = cli(venv_python, ["plugins"], tmp_path)
    row = next(line.split() for line in listed.stdout.splitlines() if line.startswith(EXAMPLE + " "))
    hooks = ["theseus_callbacks,", "theseus_gather,", "theseus_metrics_sinks"]
    assert row == [EXAMPLE, "0.1.0", ">=0.1,<0.2", "5", "16", *hooks, "ok"], listed.stdout
    assert "warning" not in listed.stderr
    components = cli(venv_python, ["components", "--kind", "optimizer"], tmp_path).stdout
    assert "optimizer/example-nadamw" in components


def test_an_example_job_trains_on_prepared_data(venv_python: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    prepare = ["data/max_documents=16", "data/val_fraction=0.125", "data/workers=1"]
    cli(venv_python, ["run", "data/tokenize", *prepare, "--root", str(root)], tmp_path)
    assert (root / "data" / "python-stdlib" / "header.json").is_file()

    done = cli(venv_python, ["run", "example/gpt/train", *TINY, "--root", str(root)], tmp_path)
    run_dir = root / "runs" / "example-gpt-train"
    assert "example-gpt-train: step 2/2; val loss" in done.stdout, done.stdout

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    splits = {r["split"]: r for r in records}
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2]
    assert set(splits) == {"train", "val", "eval", "analysis"}
    assert 0.0 <= splits["eval"]["next_token/accuracy"] <= 1.0 and splits["eval"]["next_token/targets"] == 4 * 32

    with (run_dir / "metrics.csv").open() as handle:
        sunk = {(int(r["step"]), r["name"]): float(r["value"]) for r in csv.DictReader(handle)}
    assert sunk[(2, "train/loss")] == pytest.approx(splits["train"]["loss"])
    assert sunk[(2, "val/loss")] == pytest.approx(splits["val"]["loss"])

    with (run_dir / "analysis" / "entropy" / "step_00000002.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == 32 and all(float(r["entropy"]) > 0 for r in table)
    assert splits["analysis"]["entropy/mean"] > 0

    config = (run_dir / "config.yaml").read_text()
    assert "vocab_size: 257" in config and "scale: 1.0" in config
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert provenance["job_class"] == "theseus_plugins_example.trainers:ExampleTrainer"
    assert provenance["model"] == "theseus_plugins_example.models:ScaledGPT"
    assert EXAMPLE in provenance["plugins"]

    # The example's optimizer and schedule selected by name on a core job: installed, then used.
    core = [a for a in TINY if not a.startswith("evaluation/")]
    chosen = ["optimizer=example-nadamw", "schedule=example-rsqrt", "optimizer/example-nadamw/beta2=0.98"]
    cli(
        venv_python,
        ["run", "train/pretrain", *core, "evaluation=", "training/eval_batches=0", *chosen, "--root", str(root)],
        tmp_path,
    )
    selected = json.loads((root / "runs" / "train-pretrain" / "provenance.json").read_text())["selection"]
    assert (selected["optimizer"], selected["schedule"]) == ("example-nadamw", "example-rsqrt")
    config = (root / "runs" / "train-pretrain" / "config.yaml").read_text()
    assert "example-nadamw:" in config and "beta2: 0.98" in config and "adamw:" not in config.replace("nadamw:", "")
