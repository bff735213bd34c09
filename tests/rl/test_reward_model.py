"""Learned rewards: the Bradley-Terry loss against TRL 1.16's ``RewardTrainer`` (a test-only oracle), a
tiny ``train/reward`` run that separates held-out pairs, ``reward/model`` scoring with that run exactly
as the trained state does, and a GRPO configuration mixing it with a rule reward."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import TINY_GPT, Oracle
from tests.finetune.conftest import TINY_DPO, prepare_preferences
from theseus.base.job import running_under
from theseus.config import configuration, configure
from theseus.errors import ConfigError
from theseus.model.reward.component import ModelReward
from theseus.model.reward.loss import bradley_terry
from theseus.model.reward.trainer import RewardTrainer

torch = Oracle("torch")
reward_trainer = Oracle("trl.trainer.reward_trainer")

TOLERANCE = 1e-5
PAIRS = 16
STEPS = 24


def trl_reward_loss(
    chosen: np.ndarray, rejected: np.ndarray, margin: np.ndarray | None, center: float | None
) -> tuple[float, np.ndarray, dict[str, float]]:
    """TRL's loss, its gradient with respect to the rewards (chosen rows then rejected rows) and its
    metrics: ``RewardTrainer.compute_loss`` on a stand-in trainer holding only what that method reads, the
    model a stand-in whose logits are the given rewards."""
    rewards = torch.tensor(np.concatenate([chosen, rejected])[:, None], requires_grad=True)
    metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True),
        args=SimpleNamespace(center_rewards_coefficient=center),
        accelerator=SimpleNamespace(gather_for_metrics=lambda x: x, gather=lambda x: x),
        _total_train_tokens=0,
        _tp_size=1,
        _metrics=metrics,
    )
    inputs: dict[str, Any] = {"attention_mask": torch.ones(2 * len(chosen), 3, dtype=torch.long)}
    if margin is not None:
        inputs["margin"] = torch.tensor(margin)
    loss = reward_trainer.RewardTrainer.compute_loss(trainer, lambda **_: SimpleNamespace(logits=rewards), inputs)
    loss.backward()
    assert rewards.grad is not None
    return float(loss.detach()), rewards.grad.numpy()[:, 0], {k: float(v[-1]) for k, v in metrics["train"].items()}


@pytest.mark.parametrize(("with_margin", "center"), [(False, None), (True, None), (False, 0.01), (True, 0.3)])
def test_the_loss_equals_trl_reward_trainer(with_margin: bool, center: float | None) -> None:
    rng = np.random.default_rng(3)
    chosen, rejected = rng.normal(0.0, 2.0, PAIRS), rng.normal(0.0, 2.0, PAIRS)
    margin = rng.uniform(0.0, 1.0, PAIRS) if with_margin else None
    expected, expected_grad, expected_metrics = trl_reward_loss(chosen, rejected, margin, center)

    def ours(rewards: jax.Array) -> tuple[jax.Array, Any]:
        given = None if margin is None else jnp.asarray(margin, jnp.float32)
        return bradley_terry(rewards[:PAIRS], rewards[PAIRS:], given, center or 0.0)

    rewards = jnp.asarray(np.concatenate([chosen, rejected]), jnp.float32)
    (loss, metrics), grad = jax.value_and_grad(ours, has_aux=True)(rewards)
    assert abs(float(loss) - expected) <= TOLERANCE, (float(loss), expected)
    np.testing.assert_allclose(np.asarray(grad), expected_grad, atol=TOLERANCE, rtol=0)
    assert float(metrics["accuracy"]) == pytest.approx(expected_metrics["accuracy"], abs=TOLERANCE)
    assert float(metrics["margin"]) == pytest.approx(expected_metrics["margin"], abs=TOLERANCE)
    assert 0.0 < expected_metrics["accuracy"] < 1.0  # both outcomes are among the pairs


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RewardTrainer]:
    """Pairs whose chosen answers start with "sure", rejected ones with "nope" (every eighth held out),
    and a 24-step reward model of a one-layer GPT trained on them (``judge``)."""
    root = tmp_path_factory.mktemp("reward-root")
    prepare_preferences(root)
    trainer = RewardTrainer.create(
        root, {**TINY_DPO, "run/name": "judge", "training/steps": STEPS, "training/eval_batches": 2}
    )
    trainer.run()
    trainer.close()
    return root, trainer  # type: ignore[return-value]


def records(root: Path, split: str) -> list[dict[str, Any]]:
    rows = map(json.loads, (root / "runs" / "judge" / "metrics.jsonl").read_text().splitlines())
    return [row for row in rows if row["split"] == split]


def test_a_tiny_reward_model_separates_held_out_pairs(trained: tuple[Path, RewardTrainer]) -> None:
    root, _ = trained
    first = records(root, "train")[0]
    assert first["loss"] == pytest.approx(math.log(2), abs=0.05)  # a fresh head scores both alike
    held_out = records(root, "val")[-1]
    assert held_out["step"] == STEPS and held_out["pairs"] == 8
    assert held_out["accuracy"] >= 0.9, held_out  # chance is 0.5
    assert held_out["margin"] > 1.0 and held_out["loss"] < 0.3
    assert held_out["rewards/chosen"] > held_out["rewards/rejected"]
    assert (root / "runs" / "judge" / "accuracy.png").exists()


def test_reward_model_scores_with_the_run_as_the_trained_state_does(
    trained: tuple[Path, RewardTrainer], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, trainer = trained
    monkeypatch.setenv("THESEUS_ROOT", str(root))
    with configuration({"reward/model/run": "run:judge", "reward/model/batch_size": 4}):
        reward = configure(ModelReward)
    prompts = ["Q: red tea\nA: ", "Q: map why\nA: ", "Q: sun cat\nA: "] * 2
    completions = ["sure hi", "sure two red", "sure map", "nope hi", "nope two red", "nope map"]
    scores = reward(prompts, completions, [{}] * 6)
    assert min(scores[:3]) > max(scores[3:]), scores  # unseen pairs, "sure" preferred

    # the checkpoint read back scores a prompt and completion as the trained state scores their tokens,
    # wherever the row's padding starts and whatever it holds
    state = trainer.state
    assert state is not None
    text = prompts[0] + completions[0]
    ids = np.frombuffer(text.encode(), np.uint8).astype(np.int32)
    x = np.full((2, 48), 7, np.int32)
    x[:, : ids.size] = ids
    mask = np.zeros((2, 48), bool)
    mask[0, : ids.size] = True
    mask[1, : ids.size] = True
    x[1, ids.size :] = 99
    direct = state.apply_fn({"params": state.params}, x, padding_mask=mask, deterministic=True, method="rewards")
    assert abs(float(direct[0]) - float(direct[1])) <= 1e-6
    assert abs(scores[0] - float(direct[0])) <= TOLERANCE, (scores[0], float(direct[0]))


def test_reward_model_without_a_run_or_with_an_unknown_one_is_one_line(
    trained: tuple[Path, RewardTrainer], monkeypatch: pytest.MonkeyPatch
) -> None:
    with configuration({}):
        reward = configure(ModelReward)
    with pytest.raises(ConfigError, match=r"pass reward/model/run=run:NAME\[@STEP\] \(a run of train/reward\)"):
        reward(["p"], ["c"], [{}])
    # the run is looked up under the job's root (theseus run --root), not the environment's
    elsewhere = str(trained[0].parent / "elsewhere")
    monkeypatch.setenv("THESEUS_ROOT", elsewhere)
    with configuration({"reward/model/run": "run:jduge"}):
        reward = configure(ModelReward)
    with (
        running_under(trained[0]),
        pytest.raises(ConfigError, match=r"^reward/model/run=run:jduge: no run 'jduge' under .*available: judge"),
    ):
        reward(["p"], ["c"], [{}])
    assert os.environ["THESEUS_ROOT"] == elsewhere


def test_lora_is_refused_in_one_line(trained: tuple[Path, RewardTrainer]) -> None:
    root, _ = trained
    trainer = RewardTrainer.create(root, {**TINY_DPO, "model/lora/rank": 4, "run/name": "adapted"})
    with pytest.raises(ConfigError, match=r"model/lora/rank=4: train/reward trains the whole model"):
        trainer.setup()


def test_grpo_mixes_the_learned_reward_with_a_rule_reward(
    trained: tuple[Path, RewardTrainer], monkeypatch: pytest.MonkeyPatch
) -> None:
    from theseus.model.rl.trainer import GRPOTrainer
    from theseus.rl.environment import Prompt

    root, _ = trained
    monkeypatch.setenv("THESEUS_ROOT", str(root))
    settings = [
        *TINY_GPT,
        "architecture/vocab_size=257",
        "architecture/block_size=256",  # room for an arithmetic prompt and its answer
        "training/sequence_length=256",
        "environment=arithmetic",
        "rl/rewards=model:1.0,format:0.5",
        "reward/model/run=run:judge",
        "run/name=judged",
    ]
    grpo = GRPOTrainer.create(root, settings)
    assert isinstance(grpo, GRPOTrainer)
    source = grpo.rollout_source
    assert source.weights == {"model": 1.0, "format": 0.5}
    prompts = [Prompt("Q: red tea\nA: ", {"answer": "1"})] * 2
    completions = ["sure <answer>1</answer>", "nope map"]
    with configuration(source.config):
        total, per_reward = source.environment.score(prompts, completions, source.weights)
    learned = per_reward["model"]
    assert per_reward["format"] == [1.0, 0.0]
    assert total == pytest.approx([learned[0] + 0.5, learned[1]], abs=1e-9)
    assert learned[0] > learned[1]
    # a reward run that is not there fails before any rollout, in one line; a plan (set-up alone) reads no run
    unknown = [*settings[:-2], "reward/model/run=run:jduge", "run/name=misjudged"]
    misjudged = GRPOTrainer.create(root, unknown)
    misjudged.setup()
    with pytest.raises(ConfigError, match=r"^reward/model/run=run:jduge: no run 'jduge' under .*available: judge"):
        misjudged.prepare_to_run()


def test_an_objective_reading_rewards_of_a_model_without_them_is_one_line() -> None:
    from theseus.model.models import GPT
    from theseus.training.steps import ModelCall, sequence_rewards

    call = ModelCall(GPT(), lambda *_, **__: None)
    with pytest.raises(ConfigError, match=r"GPT has no rewards\(x, padding_mask, deterministic\) method"):
        sequence_rewards(call, {}, {"x": np.zeros((2, 4), np.int32)}, None, True)
