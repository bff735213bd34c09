"""The ``theseus runs`` benchmark runs at a small size and produces its rows (no timing asserted)."""

from __future__ import annotations

from benchmarks import runs_listing


def test_runs_listing_benchmark_produces_every_row() -> None:
    rows = runs_listing.measure(count=8, repeats=1)
    assert [r.name for r in rows] == [
        "`theseus runs` (8 runs)",
        "`theseus runs --json` (8 runs)",
        "`theseus jobs` (same rounds, for scale)",
        "listing alone, in process (8 runs)",
    ]
    assert all(r.value is not None and r.value > 0 for r in rows)
    assert rows[0].goal == runs_listing.GOAL_SECONDS and rows[0].status in ("pass", "miss")
