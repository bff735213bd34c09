"""Shared tiny runs for the tracking tests: one with every tracker (stopped, interrupted, resumed) and one
stopped early whose plugin sink raises."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.training.conftest import quick
from tests.training.tiny import TinyTrainer

HERE = Path(__file__).resolve().parent
JOB_FILE = HERE / "job.py"


@dataclass
class Runs:
    root: Path
    log: str  # what the runs printed (stderr)
    first_invocation_status: dict[str, Any]


class Exploding:
    """A plugin sink that fails at its second write."""

    name = "exploding"

    def __init__(self) -> None:
        self.writes = 0

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.writes += 1
        if self.writes == 2:
            raise ConnectionError("quota exceeded")

    def close(self) -> None:
        pass


#: The table the tracked runs send the trackers at each update (``StepInfo.log_table``), as rollouts are.
TABLE = "samples"
TABLE_COLUMNS = ["step", "text", "score"]


def table_rows(step: int) -> list[list[Any]]:
    """The rows of :data:`TABLE` at ``step``: a line of text, and one of two lines."""
    return [[step, f"rollout of step {step}", 0.5 * step], [step, "first line\nsecond line", -1.0]]


def log_table(info: Any) -> None:
    info.log_table(TABLE, TABLE_COLUMNS, table_rows(info.step))


def tracked_settings(name: str, **extra: Any) -> dict[str, Any]:
    values = {
        "run__name": name,
        "training__eval_batches": 1,
        "training__eval_interval": 3,
        "training__checkpoint_interval": 3,
        **extra,
    }
    return quick(**values)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """``tracked``: all trackers, stopped at 3, a crashed invocation's extra TensorBoard steps, resumed to 6,
    a table sent at each update; ``stopped``: a higher learning rate, stopped at 3, its plugin sink raising at
    the second write (it takes no tables)."""
    from theseus.tracking.status import read_status
    from theseus.tracking.tensorboard import TensorBoardSink
    from theseus.training.callbacks import Callback
    from theseus.training.loop import TrainingLoop

    root = tmp_path_factory.mktemp("tracking-root")
    scratch = tmp_path_factory.mktemp("wandb-home")
    log = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(log):
        for var, value in {
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "WANDB_CONFIG_DIR": str(scratch / "config"),
            "WANDB_CACHE_DIR": str(scratch / "cache"),
            "WANDB_DATA_DIR": str(scratch / "data"),
            "MLFLOW_ALLOW_FILE_STORE": "true",
        }.items():
            mp.setenv(var, value)
        mp.setattr(TinyTrainer, "CALLBACKS", [Callback(log_table, on="step")])
        sinks = {"metrics/sinks": "jsonl,tensorboard,wandb,mlflow"}
        tracked = TinyTrainer.create(root, tracked_settings("tracked", training__stop_after=3, **sinks))
        tracked.run()
        first = read_status(root / "runs" / "tracked") or {}
        # An invocation that logged steps 4 and 5 to TensorBoard and then died before its next checkpoint.
        crashed = TensorBoardSink(root / "runs" / "tracked", start=3)
        crashed.write(4, {"train/loss": 99.0})
        crashed.write_table(4, TABLE, TABLE_COLUMNS, [[4, "from the crashed invocation", 0.0]])
        crashed.write(5, {"train/loss": 98.0})
        crashed.close()
        tracked.args.stop_after = 0  # the same command again, without stop_after (reusing the compiled step)
        tracked.run()

        mp.setattr(TrainingLoop, "_sinks", lambda self: [Exploding()])
        stopped = TinyTrainer.create(root, tracked_settings("stopped", training__stop_after=3, training__lr=2e-2))
        stopped.run()
    yield Runs(root=root, log=log.getvalue(), first_invocation_status=first)
