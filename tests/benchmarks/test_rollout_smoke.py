"""The rollout benchmark times both decoders at a trivially small size and produces its rows (no
timing asserted); the GRPO share is read from a run's train rows."""

from __future__ import annotations

import pytest

from benchmarks import rollout
from benchmarks.common import markdown_table


@pytest.fixture(autouse=True, scope="module")
def oracles() -> None:
    """transformers (on torch), imported by this module's tests, not while the suite is collected."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


TINY = rollout.Setting(layers=1, width=32, heads=2, prompts=3, new_tokens=4, shortest=2, longest=5, rounds=1)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_rollout_benchmark_times_both_decoders_on_the_same_weights(family: str) -> None:
    setting = rollout.Setting(**{**TINY.__dict__, "family": family})
    generation = rollout.measure_generation(setting, log=lambda text: None)
    assert generation["tokens"] == 3 * 4 and generation["first_call"] > 0
    assert generation["logit_difference"] < 1e-4  # the imported weights are transformers' own
    assert "theseus" in generation["seconds"] and rollout.transformers_name(1) in generation["seconds"]
    assert all(len(times) == 1 and times[0] > 0 for times in generation["seconds"].values())
    rows = rollout.rows_of(setting, generation, None)
    ratio = next(row for row in rows if row.name == "theseus ÷ transformers tokens/s")
    assert ratio.value is not None and ratio.value > 0 and ratio.status in ("pass", "miss")
    assert len(markdown_table(rows).splitlines()) == 6 + len(rows)


def test_rollout_share_is_read_from_the_steps_without_a_compile() -> None:
    def row(step: int, rollout: float, update: float) -> dict[str, float]:
        return {"step": step, "rollout_seconds": rollout, "update_seconds": update, "rollout_tokens_per_s": 10.0}

    rows = [row(3, 1.0, 2.0), row(1, 9.0, 0.0), row(4, 3.0, 4.0), row(2, 1.0, 50.0)]
    share = rollout.rollout_share(rows)
    assert share["rollout_s"] == 2.0 and share["update_s"] == 3.0 and share["share"] == 0.4
    assert share["steps"] == 2.0 and share["first_rollout_s"] == 9.0
    with pytest.raises(ValueError, match="give it 3 or more"):
        rollout.rollout_share(rows[1:2])
    assert [r.name for r in rollout.rows_of(rollout.Setting(), None, share)] == [
        "GRPO step: rollout share (rollout ÷ rollout + update)"
    ]
    setting = rollout.Setting()
    assert rollout.grpo_overrides(setting, "x")[:2] == ["environment=arithmetic", "architecture/n_layers=4"]
    assert "training/batch_size=64" in rollout.grpo_overrides(setting, "x")
