"""The example plugin's ``environment/reverse`` and ``reward/reversed``, found through their entry points."""

from __future__ import annotations

from theseus.registry import get_registry
from theseus.rl import load_environment, load_reward
from theseus_plugins_example.reverse import ReverseWord, reversed_word


def test_the_reverse_environment_and_its_reward_are_found_through_their_entry_points() -> None:
    registry = get_registry()
    assert registry.component("environment", "reverse").distribution == "theseus-plugins-example"
    assert registry.component("reward", "reversed").distribution == "theseus-plugins-example"
    assert load_reward("reversed") is reversed_word
    env = load_environment("reverse", max_length=5)
    assert isinstance(env, ReverseWord)
    prompts = env.prompts("train", seed=0, step=0, count=4)
    assert prompts == env.prompts("train", seed=0, step=0, count=4)
    assert all(3 <= len(p.metadata["word"]) <= 5 for p in prompts)
    held_out = {p.text for step in range(10) for p in env.prompts("eval", 0, step, 8)}
    assert not held_out & {p.text for step in range(10) for p in env.prompts("train", 0, step, 8)}
    answers = [
        f"<answer>{prompts[0].metadata['answer']}</answer>",
        prompts[1].metadata["answer"],
        "<answer>no</answer>",
    ]
    total, per = env.score(prompts[:3], answers)
    assert per == {"reversed": [1.0, 1.0, 0.0], "format": [1.0, 0.0, 1.0]}
    assert total == [1.1, 1.0, 0.1]
