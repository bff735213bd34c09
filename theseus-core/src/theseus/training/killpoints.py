"""Crash injection for tests: ``THESEUS_TEST_KILL_AT="phase:step"`` SIGKILLs the process at that point.

Off unless the variable is set. Phases of update ``step`` (1-based, the step a checkpoint would be named):

- ``data``: its batch has been read from the prepared data and not yet used;
- ``step``: its update has been dispatched to the device, its results not yet fetched or logged;
- ``save``: its checkpoint is being written: orbax has started and, with the default
  ``training/async_checkpoints=true``, commits in the background, so nothing is committed yet.

The crash/resume tests run a job with it, run the same command again, and compare the result
with an uninterrupted run.
"""

from __future__ import annotations

import os
import signal

ENV = "THESEUS_TEST_KILL_AT"
PHASES = ("data", "step", "save")


def kill_point(phase: str, step: int) -> None:
    """SIGKILL this process if ``THESEUS_TEST_KILL_AT`` names ``phase:step``."""
    wanted = os.environ.get(ENV)
    if wanted and wanted == f"{phase}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
