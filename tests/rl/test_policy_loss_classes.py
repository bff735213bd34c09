"""One class per policy loss: the built-in ones are registered components, ``rl/loss`` resolves a loss a
plugin registers like a built-in one, and an unknown name is one line naming the choices."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from theseus.errors import ConfigError
from theseus.model.rl.loss import CLIPPED, LOSS_TYPES, policy_loss
from theseus.model.rl.options import PolicyLossOptions
from theseus.model.rl.policy_losses import BUILT_IN, Batch, ClippedSurrogate, loss_class, policy_loss_names
from theseus.registry import Registry, get_registry


class HalvedGRPO(ClippedSurrogate):
    """A plugin's loss: GRPO's, halved."""

    name = "halved_grpo"

    def reduce(self, summed: jnp.ndarray, batch: Batch) -> jnp.ndarray:
        return 0.5 * super().reduce(summed, batch)


@pytest.fixture
def plugin_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin distribution registering ``rl_loss/halved_grpo`` (in a registry of this test's own, so no
    other test sees it)."""
    from types import SimpleNamespace

    from theseus.plugins import discovery

    registry = Registry()
    registry.add_component("rl_loss/halved_grpo", HalvedGRPO, distribution="theseus-plugin-halved", version="1")
    monkeypatch.setattr(discovery, "plugins", lambda: SimpleNamespace(registry=registry))


def rollout() -> dict[str, jnp.ndarray]:
    rng = np.random.default_rng(0)
    logps = jnp.asarray(-rng.uniform(0.1, 3.0, (4, 6)), jnp.float32)
    old = logps + jnp.asarray(rng.normal(0, 0.2, (4, 6)), jnp.float32)
    mask = jnp.asarray(np.arange(6)[None, :] < np.array([[6], [3], [5], [1]]), jnp.float32)
    return {"logps": logps, "old_logps": old, "advantages": jnp.asarray([1.0, -0.5, 0.25, -2.0]), "mask": mask}


def test_every_built_in_loss_is_a_registered_component() -> None:
    registered = {entry.name: entry.load() for entry in get_registry().components_of("rl_loss")}
    assert {name: registered[name] for name in BUILT_IN} == BUILT_IN
    assert LOSS_TYPES == ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
    assert CLIPPED == ("grpo", "dr_grpo", "dapo", "bnpo", "luspo")


@pytest.mark.usefixtures("plugin_loss")
def test_a_registered_loss_is_chosen_by_name_like_a_built_in_one() -> None:
    batch = rollout()
    grpo, grpo_metrics = policy_loss(**batch, loss_type="grpo")
    halved, halved_metrics = policy_loss(**batch, loss_type="halved_grpo")
    assert float(halved) == pytest.approx(0.5 * float(grpo), rel=1e-6)  # a power of two: exact but for fusion
    assert set(halved_metrics) == set(grpo_metrics)
    assert loss_class("halved_grpo") is HalvedGRPO and "halved_grpo" in policy_loss_names()
    PolicyLossOptions().check_policy_loss("halved_grpo", 0.2)  # rl/loss=halved_grpo is accepted


@pytest.mark.usefixtures("plugin_loss")
def test_an_unknown_loss_is_one_line_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"^rl/loss='halved_grp' is not accepted; use one of: grpo, dr_grpo, .*"):
        PolicyLossOptions().check_policy_loss("halved_grp", 0.2)
    with pytest.raises(ConfigError, match=r"\(did you mean 'halved_grpo'\?\)$"):
        PolicyLossOptions().check_policy_loss("halved_grp", 0.2)
    with pytest.raises(ValueError, match=r"loss_type must be one of \('grpo', .*got 'ppo'"):
        policy_loss(**rollout(), loss_type="ppo")


@pytest.mark.parametrize("name", list(BUILT_IN))
def test_every_loss_trains_at_its_defaults_with_the_sampling_correction_active(name: str) -> None:
    """``rl/loss=NAME`` alone passes the checks and computes a finite loss with the keys it then takes, the
    sampling correction active (rollouts that carry a sampler's log-probabilities)."""
    from theseus.model.rl.trainer import GRPOConfig

    config = GRPOConfig(loss=name)
    config.check_policy_loss(name, config.upper_clip)
    batch = rollout()
    sampler = batch["old_logps"] + 0.1
    loss, metrics = policy_loss(
        **batch,
        loss_type=name,
        importance_sampling=config.ratio_level,  # type: ignore[arg-type]
        epsilon_low=config.epsilon_low,
        epsilon_high=config.upper_clip,
        sampling_logps=sampler,
        **dict(config.policy_loss_options(name)),
    )
    assert np.isfinite(float(loss)) and float(loss) != 0.0
    assert all(np.isfinite(float(value)) for value in metrics.values())


def test_a_loss_whose_defaults_differ_takes_them_where_the_keys_are_not_set() -> None:
    """TRL 1.16's defaults: the upper clip is the lower one's value; cispo caps at 5 (the value TRL
    recommends: its 0.2 would scale every on-policy token down), luspo's ratio is per sequence (TRL: it
    requires it), vespo's correction per token (TRL: it requires a token mode). A key set wins."""
    from theseus.model.rl.trainer import GRPOConfig

    def defaults(**keys: object) -> tuple[float, str, str]:
        config = GRPOConfig(**keys)  # type: ignore[arg-type]
        return config.upper_clip, config.ratio_level, config.correction_mode(config.loss)

    assert defaults() == (0.2, "token", "sequence_mask")
    assert defaults(epsilon_low=0.3) == (0.3, "token", "sequence_mask")
    assert defaults(loss="cispo") == (5.0, "token", "sequence_mask")
    assert defaults(loss="luspo") == (0.2, "sequence", "sequence_mask")
    assert defaults(loss="vespo") == (0.2, "token", "token_mask")
    set_keys = {"epsilon_high": 2.0, "importance_sampling": "token", "sampling_correction_mode": "token_truncate"}
    assert defaults(loss="cispo", **set_keys) == (2.0, "token", "token_truncate")
    assert defaults(loss="luspo", **set_keys) == (2.0, "token", "token_truncate")
    with pytest.raises(ConfigError) as refused:
        config = GRPOConfig(loss="vespo", sampling_correction_mode="sequence_mask")
        config.check_policy_loss("vespo", config.upper_clip)
    assert str(refused.value) == (
        "rl/loss=vespo: vespo folds the sampling correction into its weight per token, so it takes a token_* mode, "
        "got 'sequence_mask'; set rl/sampling_correction_mode=token_mask or token_truncate"
    )
    GRPOConfig(loss="vespo", sampling_correction=False, sampling_correction_mode="sequence_mask").check_policy_loss(
        "vespo", 0.2
    )  # no correction: the mode is not used


@pytest.mark.usefixtures("plugin_loss")
def test_a_plugin_loss_declares_defaults_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from theseus.model.rl.trainer import GRPOConfig

    monkeypatch.setattr(HalvedGRPO, "DEFAULTS", {"rl/epsilon_high": 0.28}, raising=False)
    assert GRPOConfig(loss="halved_grpo").upper_clip == 0.28
    assert GRPOConfig(loss="halved_grpo", epsilon_high=0.25).upper_clip == 0.25
    assert GRPOConfig(loss="halved_grp").upper_clip == 0.2  # an unknown loss is refused by the check, not here
