"""The progress line shows what a person looks for: loss, lr, grad norm, tokens seen, tokens/s, MFU and ETA."""

from __future__ import annotations

from theseus.training.loop import progress_stats


def test_progress_line_fields() -> None:
    line = progress_stats(2.5, 3e-4, 0.8125, 1_572_864, 25_000.0, 0.412, 3725.0, live=False)
    assert line == "loss 2.5000 | lr 0.0003 | gnorm 0.812 | 1.6M tok | 25.0k tok/s | MFU 41.2% | ETA 1:02:05"
    # The live bar has its own ETA column; before a rate is known there is no tok/s, MFU or ETA.
    assert progress_stats(2.5, 3e-4, 0.8, 128, 25_000.0, 0.4, 95.0, live=True).endswith("MFU 40.0%")
    assert (
        progress_stats(4.0, 1e-3, 1.5, 128, 0.0, 0.0, None, live=False)
        == "loss 4.0000 | lr 0.001 | gnorm 1.5 | 128 tok"
    )
    assert progress_stats(4.0, 1e-3, 1.5, 256, 900.0, 0.0, 65.0, live=False).endswith("900 tok/s | ETA 1:05")
