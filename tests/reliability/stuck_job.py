"""A job file for ``theseus --load``: a job that leaves a thread behind that never ends, as orbax's
background threads of a failed save do, then says ``ready`` and waits to be interrupted."""

import sys
import threading
import time

from theseus.base.job import Job
from theseus.registry import job


@job("test/stuck")
class Stuck(Job):
    """Starts a thread (not a daemon) that waits forever, then sleeps until it is interrupted."""

    def run(self) -> None:
        threading.Thread(target=threading.Event().wait, name="waits-forever").start()
        print("ready", flush=True)
        time.sleep(600)
        sys.exit(0)


@job("test/broken")
class Broken(Job):
    """Starts a thread that waits forever, then fails with an error theseus does not know (a defect)."""

    def run(self) -> None:
        threading.Thread(target=threading.Event().wait, name="waits-forever").start()
        raise RuntimeError("a defect in a job")
