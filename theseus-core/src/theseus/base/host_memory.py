"""Host memory for XLA on the CPU: transparent huge pages for the buffers it allocates per call.

XLA:CPU allocates one temporary buffer per call of a compiled program, sized for all of the
program's intermediates (182 MiB for a training step of the tiny GPT at batch 8 x 256, 1.6 GB for
gpt2-124m at 1 x 512), and frees it when the call returns. glibc serves an allocation that large
with a fresh ``mmap`` and unmaps it on ``free``, so every step faults its whole working set in
again, 4 KiB at a time: 46 thousand page faults and a fifth of the step's CPU time spent in the
kernel (tiny, 2 cores).

With glibc's tunable ``glibc.malloc.hugetlb=1`` malloc asks the kernel for transparent huge pages
(``madvise(MADV_HUGEPAGE)``) on those mappings: 2 MiB pages, about 1 % of the faults, the same
peak memory. (Keeping freed buffers for reuse instead, which ``mallopt`` could set at run time,
doubled the peak memory through fragmentation.) glibc reads tunables only when a process starts,
so the ``theseus run`` command restarts itself once with the tunable set, before it imports
anything heavy; a script can be started with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``.

Nothing changes where the C library is not glibc 2.35 or newer, where transparent huge pages are
off (``never``), when ``GLIBC_TUNABLES`` already sets ``glibc.malloc.hugetlb``, or with
``THESEUS_HOST_ALLOCATOR=system``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

ENV_SWITCH = "THESEUS_HOST_ALLOCATOR"
TUNABLES = "GLIBC_TUNABLES"
HUGE_PAGES = "glibc.malloc.hugetlb=1"
#: The kernel's transparent huge page mode: ``always``, ``madvise`` or ``never`` (bracketed).
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
#: The first glibc with the ``glibc.malloc.hugetlb`` tunable.
MIN_GLIBC = (2, 35)


def glibc_version() -> tuple[int, int] | None:
    """The running glibc's (major, minor), or None on another C library."""
    try:
        name, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None


def transparent_huge_pages() -> bool:
    """Whether the kernel gives transparent huge pages to mappings that ask for them."""
    try:
        return "[never]" not in THP_MODE.read_text()
    except OSError:
        return False


def huge_page_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """``environ`` with the huge-page tunable added to ``GLIBC_TUNABLES``, or None when there is
    nothing to add (already set, ``THESEUS_HOST_ALLOCATOR=system``, no glibc >= 2.35, THP off)."""
    if environ.get(ENV_SWITCH, "").strip().lower() == "system":
        return None
    tunables = environ.get(TUNABLES, "")
    if any(item.partition("=")[0] == "glibc.malloc.hugetlb" for item in tunables.split(":")):
        return None
    version = glibc_version()
    if version is None or version < MIN_GLIBC or not transparent_huge_pages():
        return None
    return {**environ, TUNABLES: f"{tunables}:{HUGE_PAGES}" if tunables else HUGE_PAGES}


def restart_with_huge_pages() -> None:
    """Replace this process by the same command (interpreter, options and arguments) with the
    huge-page tunable set. Returns only when there is nothing to change or the restart fails.

    Call it first thing in a command's entry point: whatever the process did before is lost."""
    environ = huge_page_environment(os.environ)
    if environ is None or not sys.executable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
    except OSError:
        return
