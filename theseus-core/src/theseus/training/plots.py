"""Loss curves as PNG (matplotlib with the Agg backend, imported only when plotting)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def figure(path: Path, figsize: tuple[float, float], dpi: int = 100) -> Iterator[Any]:
    """A matplotlib (Agg) axes whose figure is written to ``path`` atomically on exit, then closed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize, dpi=dpi)
    try:
        yield ax
        fig.tight_layout()
        tmp = path.with_name(path.stem + ".tmp.png")
        fig.savefig(tmp)
        tmp.replace(path)
    finally:
        plt.close(fig)


def plot_loss(
    train: Sequence[tuple[int, float]], val: Sequence[tuple[int, float]], path: Path, title: str = ""
) -> Path:
    """Write training and validation loss against step to ``path`` (atomically)."""
    with figure(path, figsize=(7, 4.2)) as ax:
        if train:
            ax.plot([s for s, _ in train], [v for _, v in train], label="train", linewidth=1.2)
        if val:
            ax.plot([s for s, _ in val], [v for _, v in val], "o-", label="val", linewidth=1.5, markersize=3)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        if title:
            ax.set_title(title)
        ax.grid(alpha=0.3)
        if train or val:
            ax.legend()
    return path
