"""Training and validation curves as PNG (matplotlib's Agg renderer, imported only when plotting).

Figures are built with the object-oriented API (no ``pyplot`` state), so they can be drawn on a
worker thread: ``CurvePlotter`` redraws a run's plot of one metric there while training goes on.
The renderer's extension modules are loaded on the thread that submits the process's first plot, never
on a worker.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from theseus.files import replace_file

#: A metric's training and validation points, ``(step, value)``.
Curves = tuple[list[tuple[int, float]], list[tuple[int, float]]]


#: Set once a plot has been drawn on a thread that may load modules (see :class:`CurvePlotter`).
_renderer_loaded = threading.Event()


@contextlib.contextmanager
def figure(path: Path, figsize: tuple[float, float], dpi: int = 100) -> Iterator[Any]:
    """A matplotlib axes whose figure is written to ``path`` (PNG, Agg) atomically on exit."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=dpi)
    ax = fig.subplots()
    yield ax
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    replace_file(path, png.getvalue())


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
    """Redraws one metric's plot on a worker thread while training goes on.

    ``submit`` hands over the newest curves (a request not yet started is replaced by a newer one, and
    curves equal to the last submitted are not submitted again); ``wait`` returns once the newest request
    is written and raises what drawing raised.

    The process's first plot is drawn on the thread that submits it, which so loads matplotlib and every
    extension module a plot needs (fonts, Agg, layout, Pillow's PNG codec); the worker then loads none.
    A worker thread must not load an extension module while the training thread may import one: the
    first holds the dynamic loader's lock while the module's static initialisers run, and when these
    allocate enough to start Python's garbage collector, jax's collector callback waits for the
    interpreter lock, which the training thread holds while it waits for the loader's lock (a run hung at
    its first checkpoint so, importing orbax, while its plot thread imported matplotlib).
    """

    def __init__(self, path: Path, title: str = "", ylabel: str = "loss") -> None:
        self.path = path
        self.title = title
        self.ylabel = ylabel
        self._lock = threading.Lock()
        self._submitted: Curves | None = None
        self._pending: Curves | None = None
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, train: Sequence[tuple[int, float]], val: Sequence[tuple[int, float]]) -> None:
        request = (list(train), list(val))
        with self._lock:
            if request == self._submitted:
                return
            self._submitted = request
            if _renderer_loaded.is_set():
                self._pending = request
                if self._worker is None:
                    self._worker = threading.Thread(target=self._drain, name=f"theseus-plot-{self.ylabel}")
                    self._worker.start()
                return
        if self._draw(request):
            _renderer_loaded.set()

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
                self._draw(request)
            except BaseException as exc:  # whatever ends the worker is reported by wait() too
                self._error = self._error or exc

    def _draw(self, request: Curves) -> bool:
        """Write ``request``'s plot; False (and the error kept for :meth:`wait`, in the training thread)
        if drawing failed. An interrupt propagates."""
        try:
            plot_curves(request[0], request[1], self.path, self.title, self.ylabel)
        except Exception as exc:
            self._error = self._error or exc
            return False
        return True
