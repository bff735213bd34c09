"""What a plugin's environment and reward can rely on: a reward that raises is one line naming it, the prompt
and the completion (or scored 0 with ``rl/reward_errors=zero``), the text a reward receives (no end marker,
truncation flagged), the environment's accuracy reward, and ``theseus components`` showing values."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from theseus.data.chat import BUILTIN_TEMPLATES, ChatTemplate
from theseus.errors import ConfigError, RewardError
from theseus.registry import component
from theseus.rl import Environment, Prompt, end_marker, load_environment, reward_text
from theseus.rl.environments import Countdown


@component("reward/test-sorted")
def sorted_numbers(prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
    """Partial credit for sorting: the share of adjacent pairs in order; ``int()`` raises on a non-number."""
    scores = []
    for text in completions:
        numbers = [int(word) for word in text.split()]
        pairs = list(itertools.pairwise(numbers))
        scores.append(sum(a <= b for a, b in pairs) / len(pairs) if pairs else 0.0)
    return scores


@component("reward/test-nan")
def nan_on_empty(prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
    return [float("nan") if not text else 1.0 for text in completions]


@component("environment/test-sort")
@dataclass
class Sort(Environment):
    REWARDS: ClassVar[dict[str, float]] = {"test-sorted": 1.0}
    ACCURACY: ClassVar[str | None] = "test-sorted"

    def prompts(self, split: str, seed: int, step: int, count: int) -> list[Prompt]:
        return [Prompt(f"Sort these numbers, smallest first: 3 1 2 ({split} {seed} {step} {i})") for i in range(count)]


def test_a_reward_that_raises_is_one_line_naming_it_the_prompt_and_the_completion() -> None:
    env = load_environment("test-sort")
    prompts = env.prompts("train", 0, 0, 3)
    completions = ["1 2 3", "3 2 1", "1 2 three " + "x" * 80]
    with pytest.raises(RewardError) as caught:
        env.score(prompts, completions)
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        "reward 'test-sorted' raised ValueError: invalid literal for int() with base 10: 'three' on the completion "
        f"'1 2 three {'x' * 47}...' of the prompt 'Sort these numbers, smallest first: 3 1 2 (train 0 0 2)'; fix the "
        "reward and run the same command to resume from the last checkpoint, or set rl/reward_errors=zero to score "
        "such completions 0"
    )
    done = env.scored(prompts, completions, on_error="zero")  # the others keep their scores
    assert done.per_reward == {"test-sorted": [1.0, 0.0, 0.0]} and done.total == [1.0, 0.0, 0.0]
    assert [(f.reward, f.prompt, f.completion) for f in done.failures] == [
        ("test-sorted", prompts[2].text, completions[2])
    ]
    assert env.scored(prompts, ["1 3 2", "2 1", "1"], on_error="zero").per_reward["test-sorted"] == [0.5, 0.0, 0.0]
    # a score that is no finite number is the reward failing on that completion
    done = env.scored(prompts[:2], ["", "1"], {"test-nan": 1.0}, on_error="zero")
    assert (
        done.per_reward == {"test-nan": [0.0, 1.0]} and "the score nan, not a finite number" in done.failures[0].error
    )
    # a configuration problem the reward reports passes as it is
    with pytest.raises(ConfigError, match="reference answer"):
        env.score(prompts[:1], ["1"], {"correct": 1.0})


def test_the_accuracy_is_the_share_its_accuracy_reward_scores_one() -> None:
    env = load_environment("test-sort")
    assert env.solved({"test-sorted": [1.0, 0.5, 1.0]}) == [True, False, True]
    assert env.solved({"format": [1.0]}) is None  # not scored: no accuracy
    assert Countdown().solved({"countdown": [1.0, 0.0]}) == [True, False]
    assert load_environment("arithmetic").ACCURACY == "correct"


@pytest.mark.parametrize(
    ("template", "marker"), [("chatml", "<|im_end|>"), ("gemma", "<end_of_turn>"), ("phi3", "<|end|>"), ("plain", "")]
)
def test_the_text_a_reward_receives_ends_before_the_end_marker(template: str, marker: str) -> None:
    assert end_marker(ChatTemplate(BUILTIN_TEMPLATES[template], name=template)) == marker
    if not marker:
        assert reward_text("4\n", stopped=True, marker=marker) == ("4\n", False)
        assert reward_text("45", stopped=False, marker=marker) == ("45", True)
        return
    assert reward_text(f"4{marker}\n", stopped=True, marker=marker) == ("4", False)
    assert reward_text(f"4{marker}\n<|im_start|>user", stopped=False, marker=marker) == ("4", False)  # turn ended
    for cut in range(1, len(marker)):  # cut at rl/max_new_tokens inside the marker: no piece of it reaches the reward
        assert reward_text(f"4{marker[:cut]}", stopped=False, marker=marker) == ("4", True)
    assert reward_text("4 5", stopped=False, marker=marker) == ("4 5", True)
    assert reward_text("4", stopped=True, marker=marker) == ("4", False)  # ended at end of text without the marker


def test_component_detail_shows_values_of_constants(capsys: pytest.CaptureFixture[str]) -> None:
    from theseus.cli.main import main

    main(["components", "reward/correct"])
    out = capsys.readouterr().out
    assert "*EXTRACT_MODES" not in out and "DEFAULT_TAG" not in out
    assert "[one of '', auto, tag, boxed, hash, last_number, none]" in out
    assert "reward/correct/tag      str   'answer'" in out
    main(["components", "environment/jsonl"])  # its keys are f-strings of a module constant
    out = capsys.readouterr().out
    assert "environment/jsonl/extract" in out and "[one of auto, tag, boxed, hash, last_number, none]" in out


def test_a_reward_that_raises_mid_run_stops_in_one_line_and_the_run_resumes_scoring_it_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Step 1's first group makes ``fragile`` raise: the run stops with one line after checkpoint 1, and the
    same command with ``rl/reward_errors=zero`` resumes there, scores that group 0 and counts it."""
    from tests.reliability.conftest import error_line
    from tests.rl.test_grpo import grpo, train_rows

    settings = ("training/steps=2", "training/checkpoint_interval=1", "rl/rewards=fragile", "run/name=fragile")
    capsys.readouterr()
    assert grpo(tmp_path, *settings) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("error: reward 'fragile' raised ValueError: unparseable on the completion '"), line
    assert line.endswith(
        "of the prompt 'train 0 1 0: '; fix the reward and run the same command to resume from the last checkpoint, "
        "or set rl/reward_errors=zero to score such completions 0"
    )
    assert grpo(tmp_path, *settings, "rl/reward_errors=zero") == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("warning: reward 'fragile' raised")]
    assert len(warned) == 1 and "scored 0 (rl/reward_errors=zero)" in warned[0], err
    rows = train_rows(tmp_path / "runs" / "fragile")
    assert [row["reward_errors"] for row in rows] == [0.0, 8.0]  # the group of 8 completions, step 1 only


def test_rewards_see_truncation_the_environment_names_its_accuracy_and_a_flat_step_warns_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.reliability.conftest import call_cli
    from tests.rl.letters_env import CUT_AT
    from tests.rl.test_grpo import GRPO, LETTERS, train_rows

    capsys.readouterr()
    args = ["--load", str(LETTERS), "run", "train/grpo", "environment=truncation", *GRPO, "training/steps=2"]
    assert call_cli([*args, f"rl/max_new_tokens={CUT_AT}", "run/name=cut", "--root", str(tmp_path)]) == 0
    rows = train_rows(tmp_path / "runs" / "cut")
    # every completion's `truncated` agrees with its length, and `accuracy` is the share `cut` scores 1
    assert [(row["reward/cut"], row["accuracy"]) for row in rows] == [(1.0, 1.0)] * 2
    warned = [line for line in capsys.readouterr().err.splitlines() if "scored the same" in line]
    assert warned == [
        "warning: at step 1 every group's completions scored the same, so their advantages and the policy gradient "
        "are 0; set rl/dynamic_sampling=true to drop such groups and refill them, or give the reward partial credit "
        "or the environment easier prompts (shown once)"
    ]
