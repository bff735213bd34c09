"""Multi-turn episodes: a turn ends at a stop string, the environment's reply follows it, masked from the
loss, until a stop token, ``respond`` returning None, the turn limit or the episode's token budget; the
built-in calculator answers calls exactly and the example plugin's guessing game gives hints. Then GRPO
plays episodes of several turns end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TINY_GPT
from tests.reliability.conftest import call_cli
from theseus.data.chat import ChatTemplate
from theseus.data.tokenizers.byte import ByteTokenizer
from theseus.errors import PluginError
from theseus.model.generation.decode import Completion
from theseus.model.rl.episodes import Limits, policy_turns, run_episodes
from theseus.model.rl.prompts import PolicyText
from theseus.rl import load_environment
from theseus.rl.environment import Prompt
from theseus.rl.environments.calculator import Calculator, evaluate

BYTES = ByteTokenizer()
TEXT = PolicyText(BYTES, None, (BYTES.eot_id,))
PROMPT = Prompt("Compute 12 * 7 + 1.", {"answer": "85"})


def scripted(*turns: list[tuple[str, bool]]) -> tuple[list[list[list[int]]], object]:
    """A decoder that writes ``turns[t][row]`` (text, whether it ends at end of text) at turn ``t``, and
    the contexts it was given."""
    seen: list[list[list[int]]] = []

    def generate(contexts: list[list[int]], new: int, width: int, seed: int) -> list[Completion]:
        seen.append([list(c) for c in contexts])
        written = turns[len(seen) - 1]
        out = []
        for text, ends in written:
            ids = BYTES.encode(text)[:new]
            out.append(Completion(ids, ends, BYTES.eot_id if ends else None))
        return out

    return seen, generate


def test_a_tool_call_is_answered_and_the_reply_is_not_the_policys() -> None:
    calculator = Calculator()
    seen, generate = scripted(
        [("<calc>12*7</calc> and more", False), ("no call here", False)],
        [("+1 gives <answer>85</answer>", True), ("", False)],
    )
    prompts = [PROMPT, PROMPT]
    encoded = [BYTES.encode(PROMPT.text)] * 2
    tool, plain = run_episodes(generate, TEXT, calculator, prompts, encoded, Limits(32, 4, 0, 128), seed=0)
    reply = BYTES.encode("<result>84</result>")
    first, second = BYTES.encode("<calc>12*7</calc>"), BYTES.encode("+1 gives <answer>85</answer>")
    assert tool.tokens == first + reply + second + [BYTES.eot_id]
    assert tool.learned == [True] * len(first) + [False] * len(reply) + [True] * (len(second) + 1)
    assert seen[1][0] == encoded[0] + first + reply  # the policy's second turn reads the result
    assert tool.text == "<calc>12*7</calc>+1 gives <answer>85</answer>" and tool.stopped and tool.turns == 2
    assert policy_turns(tool.learned) == 2 and len(tool.policy_tokens) == len(first) + len(second)
    assert [m["role"] for m in tool.transcript] == ["user", "assistant", "tool", "assistant"]
    # no call: respond is not asked, the episode is one turn cut at the length limit
    assert plain.tokens == BYTES.encode("no call here") and all(plain.learned) and not plain.stopped
    assert calculator.score([PROMPT, PROMPT], [tool.text, plain.text])[1]["correct"] == [1.0, 0.0]


def test_turn_limit_and_token_budget_end_an_episode() -> None:
    calculator = Calculator()
    _, generate = scripted([("<calc>1+1</calc>", False)], [("<calc>2+2</calc>", False)])
    (limited,) = run_episodes(generate, TEXT, calculator, [PROMPT], [[65]], Limits(32, 1, 0, 128), seed=0)
    assert limited.tokens == BYTES.encode("<calc>1+1</calc>") and limited.turns == 1  # no reply after the last turn
    _, generate = scripted([("<calc>1+1</calc>", False)], [("<calc>2+2</calc>", False)])
    (budget,) = run_episodes(generate, TEXT, calculator, [PROMPT], [[65]], Limits(32, 4, 10, 128), seed=0)
    assert budget.tokens == BYTES.encode("<calc>1+1</calc>")[:10] and budget.turns == 1  # 10 tokens at most


def test_the_calculator_evaluates_without_eval_and_the_guessing_game_hints() -> None:
    assert evaluate("12*7") == "<result>84</result>" and evaluate("7/2") == "<result>7/2</result>"
    assert evaluate("1/0") == "<result>error: division by zero</result>"
    assert evaluate("__import__('os')").startswith("<result>error: unexpected character")
    calculator = load_environment("calculator")
    (prompt,) = calculator.prompts("train", 0, 0, 1)
    expression = prompt.metadata["expression"]
    assert calculator.respond(prompt, [{"role": "assistant", "content": f"<calc>{expression}</calc>"}]) == (
        f"<result>{prompt.metadata['answer']}</result>"
    )
    guess = load_environment("guess")
    (game,) = guess.prompts("train", 0, 0, 1)
    hidden = int(game.metadata["answer"])
    answers = [guess.respond(game, [{"role": "assistant", "content": f"<guess>{n}</guess>"}]) for n in (0, 99, hidden)]
    assert answers == ["<hint>higher</hint>", "<hint>lower</hint>", None]
    total, _ = guess.score([game] * 3, [f"<guess>{hidden}</guess>", f"<guess>1</guess><guess>{hidden}</guess>", ""])
    assert total == [1.0, 0.5, 0.0]


TOOLS = Path(__file__).with_name("tool_env.py")


def test_grpo_plays_episodes_of_several_turns(tmp_path: Path) -> None:
    """A one-layer model on an environment whose turns end at any lower-case letter and whose reply is
    ``!``: episodes of up to 3 turns; each turn adds at most its letter and the reply."""
    args = ["--load", str(TOOLS), "run", "train/grpo", "environment=tools", *TINY_GPT]
    args += ["architecture/block_size=64", "training/sequence_length=64", "architecture/vocab_size=257"]
    args += ["training/batch_size=16", "rl/group_size=4", "rl/max_new_tokens=8", "rl/max_turns=3"]
    args += ["training/steps=2", "training/log_interval=1", "training/eval_batches=1", "training/progress=false"]
    assert call_cli([*args, "training/peak_flops=1e12", "run/name=tools", "--root", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "runs" / "tools" / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if row["split"] == "train"]
    assert [row["step"] for row in train] == [1, 2]
    assert all(1.0 < row["turns"] <= 3.0 for row in train), [row["turns"] for row in train]
    # completion_length counts the policy's tokens only (the replies are masked): at most 3 turns of 8
    assert all(row["completion_length_max"] <= 3 * 8 + 1 for row in train)
    assert any(row["split"] == "val" and row["loss"] == pytest.approx(-row["reward"]) for row in rows)


class Broken(Calculator):
    """A calculator whose tool breaks: ``respond`` raises, or returns a number instead of text."""

    answer: object = None

    def respond(self, prompt: Prompt, transcript: object) -> str | None:  # type: ignore[override]
        if self.answer is None:
            raise ZeroDivisionError("the tool broke")
        return self.answer  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (None, "environment 'calculator' raised ZeroDivisionError: the tool broke in respond() to the turn "),
        (84, "environment 'calculator' returned int from respond() to the turn "),
    ],
)
def test_an_environment_that_breaks_is_one_line_naming_it_the_turn_and_the_prompt(
    answer: object, expected: str
) -> None:
    broken = Broken()
    broken.answer = answer
    _, generate = scripted([("<calc>12*7</calc>", False)])
    with pytest.raises(PluginError) as caught:
        run_episodes(generate, TEXT, broken, [PROMPT], [[65]], Limits(32, 4, 0, 128), seed=0)
    message = str(caught.value)
    assert message.startswith(expected) and "\n" not in message
    assert "'<calc>12*7</calc>'" in message and repr(PROMPT.text) in message


def test_dr_grpo_normalises_by_the_longest_episode_an_environment_allows() -> None:
    assert Limits(32, 4, 0, 256).longest_completion(multi_turn=False) == 32  # one turn
    assert Limits(32, 4, 0, 256).longest_completion(multi_turn=True) == 128  # four turns
    assert Limits(32, 4, 100, 256).longest_completion(multi_turn=True) == 100  # rl/max_episode_tokens
    assert Limits(32, 4, 0, 96).longest_completion(multi_turn=True) == 96  # what the sequence holds
    assert Limits(32, 4, 10_000, 96).longest_completion(multi_turn=True) == 96  # a budget beyond the sequence


CHATML = ChatTemplate.load("chatml")


def test_with_a_chat_template_the_reply_is_a_tool_message_between_assistant_turns() -> None:
    text = PolicyText(BYTES, CHATML, (BYTES.eot_id,))
    seen, generate = scripted([("<calc>12*7</calc>", False)], [("<answer>85</answer>", True)])
    encoded = [text.encode(PROMPT)]
    (episode,) = run_episodes(generate, text, Calculator(), [PROMPT], encoded, Limits(32, 4, 0, 256), seed=0)
    between = "<|im_end|>\n<|im_start|>tool\n<result>84</result><|im_end|>\n<|im_start|>assistant\n"
    first, reply = BYTES.encode("<calc>12*7</calc>"), BYTES.encode(between)
    assert seen[1][0] == encoded[0] + first + reply
    assert episode.learned[len(first) : len(first) + len(reply)] == [False] * len(reply)
    assert episode.text == "<calc>12*7</calc><answer>85</answer>"  # what the rewards score: the policy's turns


def test_a_template_without_tool_messages_gets_the_reply_as_it_is() -> None:
    phi3 = PolicyText(BYTES, ChatTemplate.load("phi3"), (BYTES.eot_id,))  # drops tool messages
    transcript = [{"role": "user", "content": "Compute 12 * 7."}, {"role": "assistant", "content": "<calc>12*7</calc>"}]
    assert phi3.reply(transcript, "<result>84</result>") == "<result>84</result>"
    assert TEXT.reply(transcript, "<result>84</result>") == "<result>84</result>"  # no template
