"""Ending the ``theseus`` process after a failed or interrupted command, whatever threads are left.

Python waits for every thread that is not a daemon before the process exits. After a checkpoint write
failed, orbax's background threads of that save wait for signals that never come (a key-value get
without end), so the command printed its error line and then never exited. Here the threads still
running get a short grace to finish; then the standard streams and log handlers are flushed and the
process ends at once with the command's exit code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import NoReturn

#: Seconds the threads still running after a failed command get to finish before the process ends.
GRACE_SECONDS = 2.0


def lingering_threads() -> list[threading.Thread]:
    """The threads other than this one that would keep the interpreter from exiting."""
    current = threading.current_thread()
    return [thread for thread in threading.enumerate() if thread is not current and not thread.daemon]


def exit_after_failure(code: int, grace: float = GRACE_SECONDS) -> NoReturn:
    """End the process with ``code``: as ``sys.exit`` when no thread is left running after ``grace``
    seconds, else at once (``os._exit``) once the output is flushed. A Ctrl-C meanwhile ends the wait."""
    deadline = time.monotonic() + grace
    with contextlib.suppress(KeyboardInterrupt):
        for thread in lingering_threads():
            # Thread.join itself: orbax's threads override join to raise their own errors
            threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))
    if not lingering_threads():
        sys.exit(code)
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


__all__ = ["GRACE_SECONDS", "exit_after_failure", "lingering_threads"]
