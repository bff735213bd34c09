"""The preference losses and their metrics against TRL (a test-only oracle) on fixed log-probabilities.

DPO and IPO go through TRL's ``DPOTrainer._compute_loss`` (the model replaced by fixed per-token
log-probabilities), SimPO and the label-smoothed (conservative) DPO through ``CPOTrainer.cpo_loss``,
and the per-sequence log-probabilities through ``CPOTrainer.get_batch_logps``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import Oracle
from tests.tolerances import float32_tolerance, magnitude
from theseus.base.logprobs import sequence_logps
from theseus.errors import ConfigError
from theseus.model.finetune.preference import Preference, preference_loss

torch = Oracle("torch")


@pytest.fixture(autouse=True, scope="module")
def trl() -> None:
    """TRL, the reference these losses are compared with (its trainers are imported by the tests)."""
    pytest.importorskip("trl")


PAIRS, LENGTH = 6, 12
METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)


def fixed_batch(seed: int = 0) -> dict[str, np.ndarray]:
    """Per-token log-probabilities of ``PAIRS`` chosen and rejected responses of different lengths, and
    reference log-probabilities near the policy's (so that some pairs are ranked either way)."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((2 * PAIRS, LENGTH), np.float32)  # TRL's order: every chosen row, then every rejected row
    for row in range(2 * PAIRS):
        start = int(rng.integers(1, 4))
        mask[row, start : start + int(rng.integers(3, LENGTH - start))] = 1
    token = -rng.uniform(0.1, 4.0, (2 * PAIRS, LENGTH)).astype(np.float32) * mask
    sums = token.sum(axis=1)
    reference = (sums + rng.normal(0, 2.0, sums.shape)).astype(np.float32)
    return {"token": token, "mask": mask, "sums": sums, "counts": mask.sum(axis=1), "reference": reference}


def interleaved(values: np.ndarray) -> jnp.ndarray:
    """TRL's ``[chosen..., rejected...]`` rows as theseus's pairs: chosen, rejected, chosen, ..."""
    chosen, rejected = values[:PAIRS], values[PAIRS:]
    return jnp.asarray(np.stack([chosen, rejected], axis=1).reshape(2 * PAIRS, *values.shape[1:]))


def ours(objective: Preference, batch: dict[str, np.ndarray]) -> tuple[float, dict[str, float]]:
    reference = interleaved(batch["reference"]) if objective.uses_reference else None
    loss, metrics = preference_loss(objective, interleaved(batch["sums"]), interleaved(batch["counts"]), reference)
    return float(loss), {k: float(v) for k, v in metrics.items()}


def trl_dpo(loss_type: str, beta: float, batch: dict[str, np.ndarray]) -> tuple[float, dict[str, float]]:
    """TRL's DPO loss: ``DPOTrainer._compute_loss`` with precomputed reference log-probabilities."""
    from trl import DPOTrainer

    rows, length = batch["token"].shape
    token = torch.tensor(batch["token"][:, 1:])  # per-token log-probs of the shifted targets
    mask = torch.tensor(batch["mask"])
    completion = torch.zeros(rows, length, dtype=torch.long)
    completion[:, 1:] = mask[:, 1:].long()
    completion[:, 0] = 0

    def model(**_: Any) -> Any:
        zeros = torch.zeros(rows, length - 1)
        return SimpleNamespace(log_probs=token, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())

    metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list)}
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True),
        accelerator=SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x, gather=lambda x: x),
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=[loss_type],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=0.0,
        use_weighting=False,
        _metrics=metrics,
        _total_train_tokens=0,
        _tp_size=1,
    )
    reference = torch.tensor(batch["reference"])
    inputs = {
        "input_ids": torch.zeros(rows, length, dtype=torch.long),
        "attention_mask": torch.ones(rows, length, dtype=torch.long),
        "completion_mask": completion,
        "ref_chosen_logps": reference[:PAIRS],
        "ref_rejected_logps": reference[PAIRS:],
    }
    loss = DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    return float(loss), {name: float(metrics["train"][name][0]) for name in METRICS}


def trl_cpo(loss_type: str, beta: float, chosen: np.ndarray, rejected: np.ndarray, **settings: float) -> Any:
    """TRL's CPO loss (``cpo_loss``) on the given per-pair log-probabilities: losses, rewards."""
    from trl.experimental.cpo import CPOTrainer

    trainer = SimpleNamespace(
        alpha=0.0,
        beta=beta,
        loss_type=loss_type,
        label_smoothing=settings.get("label_smoothing", 0.0),
        simpo_gamma=settings.get("simpo_gamma", 0.5),
        accelerator=SimpleNamespace(device="cpu"),
    )
    losses, chosen_rewards, rejected_rewards = CPOTrainer.cpo_loss(
        trainer, torch.tensor(chosen), torch.tensor(rejected)
    )
    return losses.mean().item(), chosen_rewards.numpy(), rejected_rewards.numpy()


@pytest.mark.parametrize(("loss", "beta"), [("sigmoid", 0.1), ("sigmoid", 0.5), ("ipo", 0.1), ("ipo", 0.4)])
def test_dpo_and_ipo_equal_trl(loss: str, beta: float) -> None:
    batch = fixed_batch()
    expected, expected_metrics = trl_dpo(loss, beta, batch)
    got, metrics = ours(Preference(loss, beta), batch)
    assert abs(got - expected) <= 1e-6 * max(1.0, abs(expected)), (got, expected)
    for name in METRICS:
        assert metrics[name] == pytest.approx(expected_metrics[name], abs=1e-5), name
    assert 0 < metrics["rewards/accuracies"] < 1  # both rankings occur: not a vacuous batch


def test_label_smoothed_dpo_equals_trl_conservative_form() -> None:
    batch = fixed_batch(1)
    ratios = batch["sums"] - batch["reference"]
    expected, _, _ = trl_cpo("sigmoid", 0.2, ratios[:PAIRS], ratios[PAIRS:], label_smoothing=0.15)
    got, _ = ours(Preference("sigmoid", 0.2, label_smoothing=0.15), batch)
    assert abs(got - expected) <= 1e-6, (got, expected)
    plain, _ = ours(Preference("sigmoid", 0.2), batch)
    assert abs(plain - got) > 1e-3  # the smoothing changes the loss


@pytest.mark.parametrize(("beta", "gamma"), [(2.0, 0.5), (2.5, 1.4)])
def test_simpo_equals_trl(beta: float, gamma: float) -> None:
    batch = fixed_batch(2)
    average = batch["sums"] / batch["counts"]
    expected, chosen_rewards, rejected_rewards = trl_cpo(
        "simpo", beta, average[:PAIRS], average[PAIRS:], simpo_gamma=gamma, label_smoothing=0.0
    )
    got, metrics = ours(Preference("simpo", beta, simpo_gamma=gamma, reference="none"), batch)
    assert abs(got - expected) <= 1e-6 * max(1.0, abs(expected)), (got, expected)
    assert metrics["rewards/chosen"] == pytest.approx(float(chosen_rewards.mean()), abs=1e-5)
    assert metrics["rewards/rejected"] == pytest.approx(float(rejected_rewards.mean()), abs=1e-5)


def test_sequence_log_probabilities_equal_trl() -> None:
    from trl.experimental.cpo import CPOTrainer

    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2.0, (4, 10, 17)).astype(np.float32)
    labels = rng.integers(0, 17, (4, 10))
    labels[:, :3] = -100  # the prompt
    labels[1, 7:] = -100  # padding
    expected_sum = CPOTrainer.get_batch_logps(torch.tensor(logits), torch.tensor(labels), average_log_prob=False)
    expected_mean = CPOTrainer.get_batch_logps(torch.tensor(logits), torch.tensor(labels), average_log_prob=True)
    targets = np.where(labels[:, 1:] == -100, -1, labels[:, 1:])
    sums, counts = sequence_logps(jnp.asarray(logits[:, :-1]), jnp.asarray(targets))
    np.testing.assert_allclose(np.asarray(sums), expected_sum.numpy(), atol=1e-5, rtol=1e-6)
    # the log-softmax over 17 logits, then the sum over up to 9 targets
    tolerance = float32_tolerance(17 + 9, scale=magnitude(expected_mean.numpy()))
    np.testing.assert_allclose(np.asarray(sums / counts), expected_mean.numpy(), atol=tolerance, rtol=0)


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_policy_equal_to_reference_gives_the_loss_at_zero_margin(loss: str) -> None:
    batch = fixed_batch(4)
    batch["reference"] = batch["sums"].copy()
    got, metrics = ours(Preference(loss, 0.1), batch)
    assert got == pytest.approx(math.log(2) if loss == "sigmoid" else (1 / 0.2) ** 2, abs=1e-6)
    assert metrics["rewards/margins"] == 0.0 and metrics["rewards/accuracies"] == 0.0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"loss": "kto"}, "dpo/loss='kto' is not one of sigmoid, ipo, simpo"),
        ({"beta": 0.0}, "dpo/beta must be above 0"),
        ({"label_smoothing": 0.5}, "dpo/label_smoothing must lie in [0, 0.5)"),
    ],
)
def test_bad_objective_settings(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        Preference(**settings)
