"""Built-in rewards on hand-made completions, answer extraction, and the ``rl/rewards`` selection."""

from __future__ import annotations

import pytest

from theseus.config import configuration, configure
from theseus.errors import ConfigError
from theseus.rl import Correct, Format, Overlong, load_reward, parse_weights
from theseus.rl.answers import extract, same


def call(reward, completions, metadata):  # type: ignore[no-untyped-def]
    return reward([""] * len(completions), completions, metadata)


def test_correct_compares_numbers_by_value_and_text_otherwise() -> None:
    completions = [
        "so <answer>1,000</answer>",
        "<answer>999</answer>",
        "the total is $1000.00.",
        "no answer here",
        "<answer> Paris </answer>",
    ]
    metadata = [{"answer": "1000"}] * 4 + [{"answer": "paris"}]
    assert call(configure(Correct), completions, metadata) == [1.0, 0.0, 1.0, 0.0, 1.0]
    boxed = configure(Correct, extract="boxed")
    assert call(boxed, ["\\boxed{\\frac{1}{2}}", "<answer>0.5</answer>"], [{"answer": "0.5"}] * 2) == [1.0, 0.0]
    with pytest.raises(ConfigError, match="reference answer"):
        call(boxed, ["x"], [{}])


def test_extraction_modes() -> None:
    text = "work: 3 + 4\n#### 1,234\n"
    assert extract(text, "hash") == "1,234" and extract(text, "last_number") == "1,234"
    assert extract("a \\boxed{x^{2}} b \\boxed{7}", "boxed") == "7"
    assert extract("<answer>a</answer> <answer> b </answer>", "tag") == "b"
    assert extract("<ans>4</ans> 5", "auto", tag="ans") == "4" and extract("nothing", "auto") is None
    assert same("1,000", "1000") and same("-2.50", "-2.5") and not same("12", "1,2")


def test_format_wants_exactly_one_non_empty_tag() -> None:
    completions = ["<answer>4</answer>", "<answer> </answer>", "4", "<answer>4</answer><answer>5</answer>", "<answer>4"]
    assert call(configure(Format), completions, [{}] * 5) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert call(configure(Format, tag="final"), ["<final>x</final>"], [{}]) == [1.0]


def test_overlong_ramps_from_zero_to_minus_one_in_tokens_or_characters() -> None:
    reward = configure(Overlong, max_length=10, buffer=4)
    tokens = [{"completion_tokens": n} for n in (6, 7, 8, 10, 11)]
    assert call(reward, ["x"] * 5, tokens) == [0.0, -0.25, -0.5, -1.0, -1.0]
    assert call(reward, ["a" * 5, "a" * 9], [{}, {}]) == [0.0, -0.75]  # characters without token counts
    overrides = {"reward/overlong/max_length": 4, "reward/overlong/buffer": 8}
    with configuration(overrides), pytest.raises(ConfigError, match="exceeds reward/overlong/max_length=4"):
        load_reward("overlong")


def test_weights_parse_and_name_an_unknown_reward_with_a_suggestion() -> None:
    assert parse_weights("correct:1.0, format:0.2,overlong") == {"correct": 1.0, "format": 0.2, "overlong": 1.0}
    with pytest.raises(ConfigError) as caught:
        parse_weights("corect:1.0")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(
        "unknown reward 'corect' (rl/rewards=corect:1.0); did you mean 'correct'?"
    )
    with pytest.raises(ConfigError, match="not a number"):
        parse_weights("correct:heavy")
    with pytest.raises(ConfigError, match="given twice"):
        parse_weights("correct,correct:2", check=False)
