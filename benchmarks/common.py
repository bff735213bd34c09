"""Shared helpers of the benchmarks: timing, machine description, result rows and the Markdown table."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """``--preset``, ``--batch`` and ``--seq``: the model and batch shape a script times (default tiny 8x256)."""
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)


def start_like_theseus_run() -> None:
    """Restart this script's process as ``theseus run`` starts a run: with transparent huge pages for
    XLA's per-call host buffers (:mod:`theseus.base.host_memory`), so that the loops timed here run as
    a user's do. Every loop of the process (PyTorch's included) gets the same setting. Call it first
    in ``if __name__ == "__main__":``."""
    from theseus.base.host_memory import restart_with_huge_pages

    restart_with_huge_pages()


def median_seconds(fn: Callable[[], Any], *, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls after ``warmup`` untimed calls.

    ``fn`` must itself wait for its result (e.g. ``block_until_ready``); its return value is ignored.
    """
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def timed_call(fn: Callable[..., Any], args: Sequence[Any]) -> float:
    """Seconds of one call of a jitted ``fn(*args)``, until its results are ready."""
    import jax

    begun = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - begun


def rotated_rounds(
    steps: Mapping[str, tuple[Callable[..., Any], Sequence[Any]]], rounds: int
) -> dict[str, list[float]]:
    """Seconds of each named ``(fn, args)`` per round, side by side: every round runs each once, in
    an order rotated by the round, after one untimed call (the first run after another program's)."""
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, args = steps[name]
            timed_call(fn, args)
            seconds[name].append(timed_call(fn, args))
    return seconds


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (falls back to ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def machine_line() -> str:
    return f"{cpu_model()}, {cpu_cores()} cores"


def load_average() -> float | None:
    """The 1-minute load average (None where the OS does not report it)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def today() -> str:
    return datetime.date.today().isoformat()


@dataclasses.dataclass
class Row:
    """One figure of the performance table.

    ``value`` is None when the figure could not be measured (``note`` says why).
    ``goal`` is a number compared with ``value`` by ``direction`` (``"max"``: value <= goal passes,
    ``"min"``: value >= goal passes) or None for an informational figure.
    """

    name: str
    value: float | None
    unit: str = ""
    goal: float | None = None
    direction: str = "min"
    note: str = ""
    fmt: str = "{:.3g}"

    @property
    def status(self) -> str:
        if self.value is None:
            return "n/a"
        if self.goal is None:
            return "info"
        ok = self.value <= self.goal if self.direction == "max" else self.value >= self.goal
        return "pass" if ok else "miss"

    def shown_value(self) -> str:
        if self.value is None:
            return "—"
        return self.fmt.format(self.value) + (f" {self.unit}" if self.unit else "")

    def shown_goal(self) -> str:
        if self.goal is None:
            return "—"
        sign = "≤" if self.direction == "max" else "≥"
        return f"{sign} {self.fmt.format(self.goal)}" + (f" {self.unit}" if self.unit else "")


def percent(name: str, fraction: float | None, goal: float | None = None, note: str = "") -> Row:
    """A row holding a fraction shown as a percentage (``goal`` also a fraction)."""
    return Row(
        name,
        None if fraction is None else 100.0 * fraction,
        "%",
        None if goal is None else 100.0 * goal,
        "min",
        note,
        "{:.1f}",
    )


def markdown_table(rows: Sequence[Row], *, title: str = "theseus performance", extra: str = "") -> str:
    """The Markdown table: a header line with date and machine, then one line per row."""
    lines = [
        f"### {title}",
        "",
        f"Date: {today()} · Machine: {machine_line()}" + (f" · {extra}" if extra else ""),
        "",
        "| Figure | Measured | Goal | Status | Notes |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        note = row.note.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {row.name} | {row.shown_value()} | {row.shown_goal()} | {row.status} | {note} |")
    return "\n".join(lines)


def publish_table(rows: Sequence[Row], output: Path | None, *, title: str, extra: str = "") -> None:
    """Print the Markdown table of ``rows`` and, given ``output``, write it there too."""
    table = markdown_table(rows, title=title, extra=extra)
    print(table)
    if output:
        output.write_text(table + "\n")


class Loop:
    """A training loop that can be timed in windows, so several loops can be measured interleaved.

    ``prepare(warmup)`` builds state, compiles and runs the first step (its wall time is returned)
    plus ``warmup`` untimed steps; ``window(steps)`` runs one untimed step, then times ``steps``
    steps and waits for them.
    """

    name = "loop"
    tokens_per_step = 0
    flops_per_step: float | None = None

    def prepare(self, warmup: int) -> float:
        raise NotImplementedError

    def window(self, steps: int) -> float:
        """Seconds for ``steps`` steps, after one untimed step: the first step after another loop's
        window is not yet at steady state. Without it, a jitted step timed right after the PyTorch
        loop came out 5-16 % slower than the same program timed later in the round (three runs,
        tiny 8x256)."""
        self.run(1)
        start = time.perf_counter()
        self.run(steps)
        return time.perf_counter() - start

    def run(self, steps: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release memory held by the loop."""


@dataclasses.dataclass
class Timing:
    """Per-step seconds of each timed window of one loop, plus its first-step time."""

    name: str
    first_step_seconds: float
    windows: list[float]
    tokens_per_step: int
    flops_per_step: float | None = None

    @property
    def step_seconds(self) -> float:
        return statistics.median(self.windows)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_seconds

    @property
    def flops_per_s(self) -> float | None:
        return None if self.flops_per_step is None else self.flops_per_step / self.step_seconds


def rotated(loops: Sequence[Loop], round_index: int) -> list[Loop]:
    """``loops`` in the order of round ``round_index``: starting ``round_index`` places later."""
    if not loops:
        return []
    shift = round_index % len(loops)
    return [*loops[shift:], *loops[:shift]]


def interleaved(loops: Sequence[Loop], *, steps: int, repeats: int, warmup: int) -> dict[str, Timing]:
    """Prepare every loop, then time ``repeats`` rounds of one ``steps``-step window per loop, in turn.

    Interleaving puts every loop through the same load swings of a shared machine, so ratios of
    their medians (or the median of per-round ratios, see :func:`paired_ratio`) are stable. Each
    round starts one loop later (:func:`rotated`), so no loop always follows the same neighbour.
    """
    firsts = {loop.name: loop.prepare(warmup) for loop in loops}
    windows: dict[str, list[float]] = {loop.name: [] for loop in loops}
    for round_index in range(repeats):
        for loop in rotated(loops, round_index):
            windows[loop.name].append(loop.window(steps) / steps)
    return {
        loop.name: Timing(loop.name, firsts[loop.name], windows[loop.name], loop.tokens_per_step, loop.flops_per_step)
        for loop in loops
    }


def paired_ratio(a: Timing, b: Timing) -> float:
    """Median over rounds of ``a``'s window time ÷ ``b``'s window time of the same round."""
    return statistics.median(x / y for x, y in zip(a.windows, b.windows, strict=True))


def run_child(command: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """Run one case's child process on the accelerator (None when it ran past ``timeout`` seconds). The chip
    is held by one program at a time: a child that starts while the last one still lets go of it (libtpu's
    lockfile) is tried once more after a pause."""
    for attempt in range(2):
        try:
            done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        if done.returncode == 0 or "lockfile" not in done.stderr or attempt:
            return done
        time.sleep(10)
    raise AssertionError("unreachable")
