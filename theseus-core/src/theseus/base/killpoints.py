"""Crash injection for tests: ``THESEUS_TEST_KILL_AT="phase:step"`` SIGKILLs the process at that point.

Off unless the variable is set. Phases of update ``step`` (1-based, the step a checkpoint would be named):

- ``setup``: (step 0 only) the run's records are written, its state not yet made or restored, nothing compiled;
- ``data``: its batch has been read from the prepared data and not yet used;
- ``step``: its update has been dispatched to the device, its results not yet fetched or logged;
- ``save``: its checkpoint is being written: orbax has started and, with the default
  ``training/async_checkpoints=true``, commits in the background, so nothing is committed yet.

``phase:step:SIGNAL`` sends that signal instead (``TERM``, ``INT``), to test preemption; several
points are separated by commas (``data:4:INT,step:4:INT`` is a double Ctrl-C).

The crash/resume tests run a job with it, run the same command again, and compare the result
with an uninterrupted run.
"""

from __future__ import annotations

import os
import signal

ENV = "THESEUS_TEST_KILL_AT"
PHASES = ("setup", "data", "step", "save")


def kill_point(phase: str, step: int) -> None:
    """Signal this process (SIGKILL unless named) if ``THESEUS_TEST_KILL_AT`` names ``phase:step``."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    for point in wanted.split(","):
        parts = point.strip().split(":")
        if parts[:2] == [phase, str(step)]:
            signum = getattr(signal, "SIG" + parts[2]) if len(parts) > 2 else signal.SIGKILL
            os.kill(os.getpid(), signum)
