"""The way to the first update stays short: no orbax, matplotlib or tracker import, no peak
measurement and a single compilation of the step before it; checkpoints, the loss plot and MFU
still come afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import clean_env

REPO = Path(__file__).resolve().parents[2]
#: Packages a run imports only once it needs them (checkpoint, plot, tracker, Hugging Face data).
LATE = ("orbax", "matplotlib", "pandas", "datasets", "tensorboard", "tensorboardX", "wandb", "mlflow", "torch")
#: Model families other than GPT (each a folder of theseus.model.models), whose modules a GPT run does not define.
MODELS = REPO / "theseus-models" / "src" / "theseus" / "model" / "models"
OTHER_FAMILIES = tuple(sorted(p.name for p in MODELS.iterdir() if (p / "__init__.py").is_file() and p.name != "gpt"))

IMPORTS = f"""
import sys
import theseus.checkpoint.shapes, theseus.cli.running, theseus.training.base, theseus.training.loop
import theseus.training.pretrain
from theseus.model.models import GPT
print(sorted({{m.split('.')[0] for m in sys.modules}} & set({LATE!r})))
families = {{m.split('.')[3] for m in sys.modules if m.startswith('theseus.model.models.')}}
print(sorted(families & set({OTHER_FAMILIES!r})))
"""

# A 3-step run of the tiny trainer (peak FLOP/s not configured: measured), validated and checkpointed
# at the end, with the heavy modules recorded when the first update's loss reaches the host.
RUN = f"""
import json, sys
from pathlib import Path
sys.path.insert(0, {str(REPO)!r})
from tests.training.conftest import quick
from tests.training.tiny import TinyTrainer
import theseus.training.loop as loop

seen = {{"dispatched": 0}}
finish, measure, step_fn = loop.TrainingLoop._finish, loop.measured_peak, TinyTrainer.train_step_fn

def first_finish(self, pending):
    seen.setdefault("modules", sorted({{m.split('.')[0] for m in sys.modules}} & set({LATE!r})))
    return finish(self, pending)

def counted_step_fn(self):  # counts the updates dispatched
    compiled = step_fn(self)
    def update(*args):
        seen["dispatched"] += 1
        return compiled(*args)
    return update

def measured():
    seen.setdefault("dispatched at peak", seen["dispatched"])
    return measure()

TinyTrainer.train_step_fn = counted_step_fn
loop.TrainingLoop._finish = first_finish
loop.measured_peak = measured
settings = quick(training__steps=3, training__eval_batches=1, training__checkpoint_interval=3)
settings.update({{"training/peak_flops": 0.0, "run/name": "startup"}})
trainer = TinyTrainer.create(sys.argv[1], settings)
trainer.run()
print(json.dumps(seen))
"""


def _python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=clean_env(**env), cwd=REPO, timeout=300
    )


def test_the_run_path_imports_no_checkpoint_plot_or_tracker_package_nor_other_families() -> None:
    done = _python(IMPORTS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-2:] == ["[]", "[]"]


def test_first_update_comes_before_orbax_matplotlib_and_the_peak_measurement(tmp_path: Path) -> None:
    done = _python(RUN, str(tmp_path), JAX_LOG_COMPILES="1")
    assert done.returncode == 0, done.stderr
    # the training step is compiled once
    assert done.stderr.count("Compiling jit(step)") == 1, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["modules"] == []
    # The peak is measured after the first update finished, before the second was dispatched.
    assert seen["dispatched at peak"] == 1
    assert "peak" in done.stderr and "TFLOP/s/device (measured float32 matmul)" in done.stderr
    run = tmp_path / "runs" / "startup"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if row["split"] == "train"]
    assert [row["step"] for row in trained] == [1, 2, 3]
    assert trained[-1]["mfu"] > 0  # the measured peak reaches the MFU figure
    assert [row["step"] for row in rows if row["split"] == "val"] == [3]
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run / "checkpoints" / "3" / "state").is_dir()


def test_a_listing_tells_whether_the_store_must_be_opened(tmp_path: Path) -> None:
    from theseus.training.checkpointing import LazyCheckpointStore, may_hold_checkpoints

    directory = tmp_path / "checkpoints"
    assert not may_hold_checkpoints(directory)  # missing
    directory.mkdir()
    (directory / "4.orbax-checkpoint-tmp-1234").mkdir()  # an interrupted save
    (directory / "3.corrupt").mkdir()  # set aside by an earlier resume
    assert not may_hold_checkpoints(directory)
    store = LazyCheckpointStore(directory, keep=1)
    assert store.latest_step() is None and not store.opened
    (directory / "2").mkdir()  # may be a committed step: only the store can tell
    assert may_hold_checkpoints(directory)
    (tmp_path / "file").write_text("")
    assert may_hold_checkpoints(tmp_path / "file")  # not a directory: the store reports it
