"""The generation compile benchmark compiles and times both layer layouts at a trivially small size
(no timing asserted); the two draw the same tokens."""

from __future__ import annotations

from benchmarks import generation_compile
from benchmarks.common import markdown_table

TINY = generation_compile.Setting(
    layers=2, width=32, heads=2, kv_heads=1, vocab=64, batch=2, prompt=4, new_tokens=6, rounds=1
)


def test_generation_compile_benchmark_times_both_layer_layouts() -> None:
    rows = generation_compile.measure(TINY, {"unrolled": False, "looped": True})
    names = [row.name for row in rows]
    assert names[:3] == ["unrolled: trace + lower", "unrolled: compile", "unrolled: new tokens/s"]
    assert all(row.value is not None and row.value > 0 for row in rows[:-1])
    assert rows[-1].name == "rows drawn alike by both variants" and rows[-1].value == 100
    assert len(markdown_table(rows).splitlines()) == 6 + len(rows)
