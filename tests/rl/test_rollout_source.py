"""``RolloutSource`` on its own (scored rollouts from what its constructor receives), and the on-policy
trainers that hold one: GRPO and on-policy distillation are siblings with keys of their own."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.conftest import TINY_GPT

SETTINGS = [
    *TINY_GPT,
    "architecture/block_size=64",
    "training/sequence_length=64",
    "architecture/vocab_size=257",
    "training/batch_size=8",
    "training/seed=3",
    "rl/group_size=4",
    "rl/max_new_tokens=8",
    "environment=letters",
]


def test_a_rollout_source_alone_samples_the_trainers_scored_rollouts(tmp_path: Path) -> None:
    """A source built from a trainer's model and mesh alone samples ``batch / group`` prompts with a
    group of scored completions each, the same ones for the same parameters and step as the trainer's
    own source, and arranges them as rows of the sequence length."""
    import tests.rl.letters_env  # noqa: F401  (registers environment/letters in this process, as --load does)
    from tests.rl.letters_env import Letters
    from theseus.config import configuration, configure
    from theseus.model.rl.prompts import policy_text
    from theseus.model.rl.rollout_source import RolloutConfig, RolloutSource
    from theseus.model.rl.trainer import GRPOTrainer

    trainer = GRPOTrainer.create(tmp_path, SETTINGS)
    assert isinstance(trainer, GRPOTrainer)
    trainer.setup()
    with configuration(trainer.context.config):
        settings, environment = configure(RolloutConfig), configure(Letters)
    text = policy_text("", tmp_path, None, chat=False)
    model, sharding, length = trainer.model, trainer.sharding, trainer.sequence_length
    source = RolloutSource(
        settings, environment, text, model, sharding, length, completions=8, seed=3, config=trainer.context.config
    )
    params = trainer.init_state().params

    sampled = source.sample(params, 0)
    done = sampled.rollouts
    assert len(done.rewards) == len(done.completions) == 8 and sampled.dropped == 0.0
    assert done.prompts[0] == done.prompts[3] != done.prompts[4]  # two prompts, a group of four each
    assert set(done.per_reward) == {"letters"} and all(0.0 <= r <= 1.0 for r in done.rewards)
    assert done == source.sample(params, 0).rollouts != source.sample(params, 1).rollouts
    assert done == trainer.rollout_source.sample(params, 0).rollouts

    rows = source.rows(done)
    for name in ("x", "y", "padding_mask", "completion_mask"):
        assert rows[name].shape == (8, 64), name
    for name in ("reward", "reward/letters", "completion_length", "turns"):
        assert rows[name].shape == (8,), name
    assert rows["completion_length"].min() >= 1 and rows["completion_length"].max() <= 9  # 8 tokens and a stop
    np.testing.assert_array_equal(rows["reward"], np.asarray(done.rewards, np.float32))

    evaluated = source.evaluate(params, 2, 3)
    assert len(evaluated.rewards) == 6 and evaluated.prompts[0] != evaluated.prompts[1]  # one completion each
    trainer.close()


def test_grpo_and_on_policy_distillation_are_siblings_with_their_own_keys() -> None:
    """Both hold a ``RolloutSource`` (``RolloutTrainer``) and list its keys; GRPO's policy-loss keys are
    GRPO's alone, and neither trainer derives from the other."""
    from theseus.config import declared_fields
    from theseus.model.rl.distill import OnPolicyDistillTrainer
    from theseus.model.rl.options import PolicyLossOptions
    from theseus.model.rl.rollout_source import RolloutConfig
    from theseus.model.rl.rollout_trainer import RolloutTrainer
    from theseus.model.rl.trainer import GRPOConfig, GRPOTrainer

    grpo = {spec.key: spec for spec in GRPOTrainer.schema()}
    distill = {spec.key: spec for spec in OnPolicyDistillTrainer.schema()}
    rollouts = {spec.key for spec in declared_fields(RolloutConfig)}
    policy_loss = {spec.key for spec in declared_fields(GRPOConfig) if spec.key.startswith("rl/")}
    assert {spec.key for spec in declared_fields(PolicyLossOptions)} <= policy_loss
    assert {"rl/loss", "rl/beta", "rl/updates_per_rollout", "rl/dynamic_sampling"} <= policy_loss
    assert rollouts <= set(grpo) and rollouts <= set(distill) and "select/environment" in distill
    assert policy_loss <= set(grpo) and not policy_loss & set(distill)
    assert (grpo["rl/group_size"].default, distill["rl/group_size"].default) == (4, 1)

    assert GRPOTrainer not in OnPolicyDistillTrainer.__mro__ and OnPolicyDistillTrainer not in GRPOTrainer.__mro__
    assert issubclass(GRPOTrainer, RolloutTrainer) and issubclass(OnPolicyDistillTrainer, RolloutTrainer)
