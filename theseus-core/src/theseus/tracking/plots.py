"""Training and validation curves as PNG (matplotlib's Agg renderer, imported only when plotting).

Figures are built with the object-oriented API (no ``pyplot`` state), so they can be drawn on a
worker thread: ``CurvePlotter`` redraws a run's plot of one metric there while training goes on.
The renderer's extension modules are loaded on the thread that submits the first plot, never on the
worker (:func:`load_renderer`).
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


@functools.cache
def load_renderer() -> None:
    """Import matplotlib and every module a curve plot loads (fonts, Agg, layout, Pillow's PNG codec)
    by drawing one (:func:`plot_curves`, to a throwaway file) on the calling thread.

    A worker thread must not load an extension module while the training thread may import one:
    the first holds the dynamic loader's lock while the module's static initialisers run, and when
    these allocate enough to start Python's garbage collector, jax's collector callback waits for
    the interpreter lock, which the training thread holds while it waits for the loader's lock (a
    run hung at its first checkpoint so, importing orbax, while its plot thread imported matplotlib).
    """
    with tempfile.TemporaryDirectory() as folder:
        plot_curves([(0, 1.0), (1, 0.5)], [(1, 0.6)], Path(folder) / "curve.png", title="run")


@contextlib.contextmanager
def figure(path: Path, figsize: tuple[float, float], dpi: int = 100) -> Iterator[Any]:
    """A matplotlib axes whose figure is written to ``path`` (PNG, Agg) atomically on exit."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=dpi)
    ax = fig.subplots()
    yield ax
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp)
    tmp.replace(path)


def plot_curves(
    train: Sequence[tuple[int, float]],
    val: Sequence[tuple[int, float]],
    path: Path,
    title: str = "",
    ylabel: str = "loss",
) -> Path:
    """Write a metric's training and validation values against step to ``path`` (atomically)."""
    with figure(path, figsize=(7, 4.2)) as ax:
        if train:
            ax.plot([s for s, _ in train], [v for _, v in train], label="train", linewidth=1.2)
        if val:
            ax.plot([s for s, _ in val], [v for _, v in val], "o-", label="val", linewidth=1.5, markersize=3)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        ax.grid(alpha=0.3)
        if train or val:
            ax.legend()
    return path


class CurvePlotter:
    """Redraws one metric's plot on a worker thread, so that training waits for matplotlib only to
    import it, at the first ``submit``.

    ``submit`` hands over the newest curves (a request not yet started is replaced by a newer
    one); ``wait`` returns once the newest request is written and raises what drawing raised.
    """

    def __init__(self, path: Path, title: str = "", ylabel: str = "loss") -> None:
        self.path = path
        self.title = title
        self.ylabel = ylabel
        self._lock = threading.Lock()
        self._pending: tuple[list[tuple[int, float]], list[tuple[int, float]]] | None = None
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, train: Sequence[tuple[int, float]], val: Sequence[tuple[int, float]]) -> None:
        load_renderer()  # here, not on the worker
        with self._lock:
            self._pending = (list(train), list(val))
            if self._worker is None:
                self._worker = threading.Thread(target=self._drain, name=f"theseus-plot-{self.ylabel}")
                self._worker.start()

    def wait(self) -> None:
        """Block until every submitted plot is written; re-raise the first drawing error."""
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.join()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _drain(self) -> None:
        while True:
            with self._lock:
                request, self._pending = self._pending, None
                if request is None:
                    self._worker = None
                    return
            try:
                plot_curves(request[0], request[1], self.path, self.title, self.ylabel)
            except BaseException as exc:  # reported by wait(), in the training thread
                self._error = self._error or exc
