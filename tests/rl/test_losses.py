"""The GRPO-family losses, the sampling correction, the group advantages and the distillation losses
against TRL 1.16 (a test-only oracle), in float64 on both sides.

TRL's own code computes every expected value: ``GRPOTrainer._compute_loss`` on a stand-in trainer
whose per-token log-probabilities are fixed tensors, ``GRPOTrainer._generate_and_score_completions``
with generation and reward functions replaced by fixed completions and rewards (it holds the
advantage grouping and the importance-sampling correction's ratio), and the static
``GKDTrainer.generalized_jsd_loss``.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import Oracle
from theseus.model.rl.importance import SAMPLING_CORRECTIONS, sampling_ratio
from theseus.model.rl.loss import CLIPPED, LOSS_TYPES, forward_kl, generalized_jsd, group_advantages, policy_loss

torch = Oracle("torch")
grpo = Oracle("trl.trainer.grpo_trainer")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
gkd = Oracle("trl.experimental.gkd.gkd_trainer")

TOLERANCE = 1e-5
ROWS, WIDTH = 8, 10
EPSILON_LOW, EPSILON_HIGH = 0.2, 0.28  # clip-higher, DAPO's recommendation
METRICS = (
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
)


@pytest.fixture(autouse=True)
def float64() -> Iterator[None]:
    """float64 JAX arrays for this module's tests only."""
    with jax.enable_x64(True):
        yield


@dataclass(frozen=True)
class Rollout:
    logps: np.ndarray
    old: np.ndarray
    ref: np.ndarray
    advantages: np.ndarray
    mask: np.ndarray
    sampling: np.ndarray


def rollout(seed: int) -> Rollout:
    """Random per-token log-probabilities of ``ROWS`` ragged completions (one full, one of a single
    token, one fully masked), the old policy's and the reference's scattered around them so that
    ratios fall on both sides of the clip range; padding holds random values too. ``sampling``, a
    stale sampler's log-probabilities, strays from the old policy's, and it gave none (NaN) for one
    token."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, WIDTH + 1, ROWS)
    lengths[:3] = WIDTH, 1, 0
    mask = (np.arange(WIDTH)[None, :] < lengths[:, None]).astype(np.int64)
    logps = -rng.uniform(0.05, 3.0, (ROWS, WIDTH))
    old = logps + rng.normal(0.0, 0.4, (ROWS, WIDTH))
    ref = logps + rng.normal(0.0, 0.5, (ROWS, WIDTH))
    sampling = np.where(mask, old + rng.normal(0.0, 0.3, (ROWS, WIDTH)), 0.0)
    sampling = sampling.astype(np.float32).astype(np.float64)  # TRL holds a sampler's log-probabilities in float32
    sampling[0, 3] = np.nan
    return Rollout(logps, old, ref, rng.normal(0.0, 1.0, ROWS), mask, sampling)


def trl_policy_loss(batch: Rollout, **options: Any) -> tuple[float, np.ndarray, dict[str, float]]:
    """TRL's loss, its gradient with respect to the per-token log-probabilities and its metrics:
    ``GRPOTrainer._compute_loss`` on a trainer stand-in holding only what that method reads."""
    logps = torch.tensor(batch.logps, requires_grad=True)
    metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
    args = SimpleNamespace(
        use_bias_correction_kl=options["kl_ratio_correction"],
        delta=options["delta"],
        steps_per_generation=1,
        **{name: options[name] for name in GAMMA_AND_TEMPERATURES},
    )
    correction = options.get("sampling_correction")
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *_, **__: (logps, torch.zeros_like(logps), None),
        get_gamma_weights=grpo.GRPOTrainer.get_gamma_weights,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=options["importance_sampling"],
        loss_type=options["loss_type"],
        beta=options["beta"],
        epsilon_low=EPSILON_LOW,
        epsilon_high=options["epsilon_high"],
        max_completion_length=options["max_completion_length"],
        use_vllm=correction is not None,
        vllm_importance_sampling_correction=correction is not None,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        args=args,
        accelerator=SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x),
        _metrics=metrics,
    )
    mask = torch.tensor(batch.mask)
    inputs = {
        "prompt_ids": torch.zeros(ROWS, 3, dtype=torch.long),
        "prompt_mask": torch.ones(ROWS, 3, dtype=torch.long),
        "completion_ids": torch.zeros(ROWS, WIDTH, dtype=torch.long),
        "completion_mask": mask,
        "advantages": torch.tensor(batch.advantages),
        "old_per_token_logps": torch.tensor(batch.old),
        "ref_per_token_logps": torch.tensor(batch.ref),
        "num_items_in_batch": torch.tensor(options["num_items_in_batch"] or int(batch.mask.sum())),
    }
    if correction is not None:
        bounds = options["sampling_clip_min"], options["sampling_clip_max"]
        inputs["importance_sampling_ratio"] = trl_sampling_ratio(batch, correction, *bounds)[0]
    loss = grpo.GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    assert logps.grad is not None
    return float(loss.detach()), logps.grad.numpy(), {k: float(v[-1]) for k, v in metrics["train"].items()}


def ours(batch: Rollout, **options: Any) -> tuple[float, np.ndarray, dict[str, float]]:
    sampling = jnp.asarray(batch.sampling) if options.get("sampling_correction") else None

    def loss_of(logps: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        return policy_loss(
            logps,
            jnp.asarray(batch.old),
            jnp.asarray(batch.advantages),
            jnp.asarray(batch.mask),
            epsilon_low=EPSILON_LOW,
            ref_logps=jnp.asarray(batch.ref),
            sampling_logps=sampling,
            **options,
        )

    (loss, metrics), grad = jax.value_and_grad(loss_of, has_aux=True)(jnp.asarray(batch.logps))
    assert loss.dtype == jnp.float64
    return float(loss), np.asarray(grad), {k: float(v) for k, v in metrics.items()}


#: The hyper-parameters of sapo and vespo, as TRL's config names them and ``policy_loss`` takes them.
GAMMA_AND_TEMPERATURES = (
    "sapo_temperature_pos",
    "sapo_temperature_neg",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
)
#: cispo's cap on the ratio (``epsilon_high``): within the ratios' spread, so that some are capped.
CISPO_CAP = 1.3
CASES: list[dict[str, Any]] = [
    {"loss_type": loss_type, "importance_sampling": level, "beta": beta}
    for loss_type in LOSS_TYPES
    for level in ("token", "sequence")
    for beta in (0.0, 0.04)
]
VARIANTS: list[dict[str, Any]] = [
    {"loss_type": "grpo", "importance_sampling": "token", "beta": 0.1, "kl_ratio_correction": False},
    {"loss_type": "grpo", "importance_sampling": "sequence", "beta": 0.1, "kl_ratio_correction": False},
    {"loss_type": "dapo", "importance_sampling": "token", "beta": 0.04, "num_items_in_batch": 123},
    {"loss_type": "dr_grpo", "importance_sampling": "token", "beta": 0.0, "max_completion_length": 32},
    {"loss_type": "bnpo", "importance_sampling": "token", "beta": 0.0, "delta": 1.25},
    {"loss_type": "luspo", "importance_sampling": "token", "beta": 0.0, "delta": 1.5},
    {"loss_type": "sapo", "importance_sampling": "token", "beta": 0.0, "sapo_temperature_pos": 2.0},
    {"loss_type": "cispo", "importance_sampling": "token", "beta": 0.0, "epsilon_high": 5.0},
    {"loss_type": "vespo", "importance_sampling": "token", "beta": 0.0, "vespo_k_neg": 1.5, "vespo_lambda_pos": 0.5},
]
#: The sampling correction on every loss, each mode (vespo: the token modes, as TRL requires).
CORRECTED: list[dict[str, Any]] = [
    {"loss_type": loss_type, "importance_sampling": "token", "beta": 0.04, "sampling_correction": mode}
    | ({"sampling_clip_min": 0.5, "sampling_clip_max": 2.0} if index % 2 else {})
    for index, (loss_type, mode) in enumerate(
        [(loss, mode) for loss in ("grpo", "dapo", "sapo", "cispo") for mode in SAMPLING_CORRECTIONS]
        + [("vespo", mode) for mode in SAMPLING_CORRECTIONS if mode.startswith("token_")]
        + [("luspo", "sequence_truncate")]
    )
]


def defaults(case: dict[str, Any]) -> dict[str, Any]:
    """``case`` over TRL's defaults of every other option (``policy_loss`` keyword arguments)."""
    options: dict[str, Any] = {
        "max_completion_length": WIDTH,
        "num_items_in_batch": None,
        "kl_ratio_correction": True,
        "delta": None,
        "epsilon_high": CISPO_CAP if case["loss_type"] == "cispo" else EPSILON_HIGH,
        "sapo_temperature_pos": 1.0,
        "sapo_temperature_neg": 1.05,
        "vespo_k_pos": 2.0,
        "vespo_lambda_pos": 3.0,
        "vespo_k_neg": 3.0,
        "vespo_lambda_neg": 2.0,
    }
    if "sampling_correction" in case:
        options |= {"sampling_clip_min": None, "sampling_clip_max": 3.0}
    return options | case


def metric_names(options: dict[str, Any]) -> tuple[str, ...]:
    """The metrics TRL logs for ``options``' loss, that ``policy_loss`` returns too."""
    names = {"cispo": ("cispo_clip_ratio",), "vespo": ("vespo/phi_seq_mean",)}
    found = METRICS if options["loss_type"] in CLIPPED else names.get(options["loss_type"], ())
    return found + (("kl",) if options["beta"] else ())


@pytest.mark.parametrize("case", CASES + VARIANTS + CORRECTED, ids=lambda case: "-".join(f"{v}" for v in case.values()))
def test_policy_loss_and_gradient_equal_trl(case: dict[str, Any]) -> None:
    options = defaults(case)
    for seed in range(3):
        batch = rollout(seed)
        loss, grad, metrics = ours(batch, **options)
        expected_loss, expected_grad, expected_metrics = trl_policy_loss(batch, **options)
        assert loss == pytest.approx(expected_loss, abs=TOLERANCE, rel=TOLERANCE)
        np.testing.assert_allclose(grad, expected_grad, atol=TOLERANCE, rtol=0)
        assert np.any(grad != 0)
        for name in metric_names(options):
            assert metrics[name] == pytest.approx(expected_metrics[name], abs=1e-6), name  # TRL logs float32
    if options["loss_type"] in CLIPPED:
        assert metrics["clip_ratio/region_mean"] > 0  # the clip range is exercised
    if options["loss_type"] == "cispo" and options["epsilon_high"] == CISPO_CAP:
        assert metrics["cispo_clip_ratio"] > 0  # the cap is exercised


def trl_scored(
    rewards: np.ndarray,
    group_size: int,
    scale: str,
    sampled: Rollout | None = None,
    correction: str | None = None,
    clip_min: float | None = None,
    clip_max: float | None = None,
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """TRL's scoring of a generation and its metrics: ``GRPOTrainer._generate_and_score_completions``
    with ``_generate`` and ``_calculate_rewards`` replaced by fixed completions and rewards. With
    ``sampled``, the completions have its lengths, the sampler (vLLM, to TRL) gave its ``sampling``
    log-probabilities and the trained policy its ``old`` ones, and ``correction`` names TRL's
    ``vllm_importance_sampling_mode``."""
    rows = len(rewards)
    completions, sampling, old = [[3, 4, 5]] * rows, None, None
    if sampled is not None:
        old = torch.tensor(sampled.old)
        lengths = sampled.mask.sum(axis=1)
        completions = [[3] * int(n) for n in lengths]
        sampling = [[None if np.isnan(x) else float(x) for x in sampled.sampling[i, :n]] for i, n in enumerate(lengths)]

    def generate(prompts: list[str]) -> tuple[Any, ...]:
        return [[1, 2]] * rows, completions, None, ["c"] * rows, sampling, {}, None, None

    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(device="cpu", gather=lambda x: x, process_index=0, num_processes=1),
        model=SimpleNamespace(training=True, is_gradient_checkpointing=False),
        environment_factories=None,
        environments=None,
        tools=None,
        _generate=generate,
        _get_per_token_logps_and_entropies=lambda *_, **__: (old, None, None),
        _calculate_rewards=lambda *_: torch.tensor(rewards)[:, None],
        _tokenizer=SimpleNamespace(pad_token_id=0),
        pad_to_multiple_of=None,
        mask_truncated_completions=False,
        args=SimpleNamespace(
            per_device_train_batch_size=rows,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
            gradient_checkpointing_kwargs=None,
        ),
        num_iterations=1,
        use_vllm=sampled is not None,
        vllm_importance_sampling_correction=sampled is not None,
        vllm_importance_sampling_mode=correction,
        vllm_importance_sampling_clip_min=clip_min,
        vllm_importance_sampling_clip_max=clip_max,
        beta=0.0,
        num_generations=group_size,
        num_generations_eval=group_size,
        multi_objective_aggregation="sum_then_normalize",
        reward_weights=torch.ones(1, dtype=torch.float64),
        reward_func_names=["reward"],
        scale_rewards=scale,
        log_multimodal=False,
        _metrics={"train": defaultdict(list)},
        _logs={
            "prompt": [],
            "completion": [],
            "rewards": defaultdict(list),
            "advantages": [],
            "extra": defaultdict(list),
        },
        _pending_extra_logs={},
        _pending_metrics={},
    )
    output = grpo.GRPOTrainer._generate_and_score_completions(trainer, [{"prompt": "p"}] * rows)
    return output, trainer._metrics["train"]


def trl_advantages(rewards: np.ndarray, group_size: int, scale: str) -> np.ndarray:
    """TRL's advantages of ``rewards``."""
    return trl_scored(rewards, group_size, scale)[0]["advantages"].numpy()


def trl_sampling_ratio(
    batch: Rollout, mode: str, clip_min: float | None, clip_max: float | None
) -> tuple[Any, dict[str, float]]:
    """TRL's importance-sampling ratio of ``batch``'s stale rollout (a tensor) and its metrics."""
    rewards = np.arange(ROWS, dtype=np.float64)
    output, metrics = trl_scored(rewards, 4, "group", batch, mode, clip_min, clip_max)
    logged = {name: float(v[-1]) for name, v in metrics.items() if name.startswith("sampling/")}
    return output["importance_sampling_ratio"], logged


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_equal_trl(scale: str) -> None:
    rng = np.random.default_rng(7)
    group_size = 4
    rewards = rng.normal(0.0, 1.0, 6 * group_size)
    rewards[4:8] = 1.0  # a group of equal rewards (std 0)
    rewards[9] = np.nan  # an unscorable completion
    rewards[12:15] = np.nan  # a group with one scorable completion (std undefined)
    rewards[16:20] = rng.integers(0, 2, 4)  # binary rewards
    expected = trl_advantages(rewards, group_size, scale)
    options: list[Any] = [scale, *{"group": [True], "batch": [], "none": [False]}[scale]]
    for option in options:
        got = np.asarray(group_advantages(jnp.asarray(rewards), group_size, scale=option))
        # TRL's nanstd forms the Bessel factor n / (n - 1) from integer counts, in float32 (torch's
        # default dtype) even for float64 rewards: a relative difference of order 1e-8.
        np.testing.assert_allclose(got, expected, atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 0.1])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_generalized_jsd_equals_trl(beta: float, temperature: float) -> None:
    rng = np.random.default_rng(int(beta * 10 + temperature))
    student = rng.normal(0.0, 2.0, (3, 5, 11))
    teacher = rng.normal(0.0, 2.0, (3, 5, 11))
    mask = rng.uniform(size=(3, 5)) < 0.7
    mask[0, 0] = True
    labels = torch.tensor(np.where(mask, 1, -100))
    jsd = gkd.GKDTrainer.generalized_jsd_loss
    for reduction in ("batchmean", "sum", "mean", "none"):
        for masked in (True, False):
            student_t = torch.tensor(student, requires_grad=True)
            expected = jsd(student_t, torch.tensor(teacher), labels if masked else None, beta, temperature, reduction)
            expected.sum().backward()
            assert student_t.grad is not None

            def value(logits: jax.Array, masked: bool = masked, reduction: str = reduction) -> jax.Array:
                return generalized_jsd(
                    logits,
                    jnp.asarray(teacher),
                    jnp.asarray(mask) if masked else None,
                    beta=beta,
                    temperature=temperature,
                    reduction=reduction,  # type: ignore[arg-type]
                )

            got = np.asarray(value(jnp.asarray(student)))
            if reduction == "none" and masked:
                assert np.all(got[~mask] == 0)
                got = got[mask]  # TRL returns the kept rows only
            np.testing.assert_allclose(got, expected.detach().numpy(), atol=TOLERANCE, rtol=0)
            if masked and reduction in ("batchmean", "none"):  # the others scale these gradients
                grad = np.asarray(jax.grad(lambda x, value=value: value(x).sum())(jnp.asarray(student)))
                np.testing.assert_allclose(grad, student_t.grad.numpy(), atol=TOLERANCE, rtol=0)
    # A global token count replaces the reduction.
    expected = jsd(torch.tensor(student), torch.tensor(teacher), labels, beta, temperature, num_items_in_batch=40)
    total = generalized_jsd(
        jnp.asarray(student),
        jnp.asarray(teacher),
        jnp.asarray(mask),
        beta=beta,
        temperature=temperature,
        num_items_in_batch=40,
    )
    assert float(total) == pytest.approx(float(expected), abs=TOLERANCE)
    if beta == 0.0:
        assert float(
            forward_kl(jnp.asarray(student), jnp.asarray(teacher), jnp.asarray(mask), temperature=temperature)
        ) == (
            pytest.approx(
                float(jsd(torch.tensor(student), torch.tensor(teacher), labels, 0.0, temperature)), abs=TOLERANCE
            )
        )


def test_losses_jit_with_static_options() -> None:
    batch = rollout(3)
    arrays = [jnp.asarray(x) for x in (batch.logps, batch.old, batch.advantages, batch.mask, batch.ref)]
    for loss_type, level in (("grpo", "sequence"), ("dapo", "token")):
        options = {"loss_type": loss_type, "importance_sampling": level, "beta": 0.04}

        def step(
            logps: jax.Array,
            old: jax.Array,
            adv: jax.Array,
            mask: jax.Array,
            ref: jax.Array,
            *,
            options: dict[str, Any] = options,
        ) -> Any:
            return jax.value_and_grad(policy_loss, has_aux=True)(logps, old, adv, mask, ref_logps=ref, **options)

        (loss, metrics), grad = jax.jit(step)(*arrays)
        (eager, _), eager_grad = step(*arrays)
        assert float(loss) == pytest.approx(float(eager), abs=1e-12)
        np.testing.assert_allclose(np.asarray(grad), np.asarray(eager_grad), atol=1e-12)
        assert set(metrics) >= {"kl", "ratio_mean", *METRICS}
    rewards = jnp.asarray(np.random.default_rng(0).normal(size=12))
    jitted = jax.jit(group_advantages, static_argnames=("group_size", "scale"))
    np.testing.assert_allclose(
        np.asarray(jitted(rewards, group_size=4)), np.asarray(group_advantages(rewards, 4)), atol=1e-12
    )
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 7)))
    jsd = jax.jit(generalized_jsd, static_argnames=("beta", "temperature", "reduction"))
    assert float(jsd(logits, logits[::-1], beta=0.3, temperature=2.0)) > 0


@pytest.mark.parametrize("mode", SAMPLING_CORRECTIONS)
@pytest.mark.parametrize("bounds", [(None, 3.0), (0.5, 2.0), (0.8, None)])
def test_sampling_ratio_equals_trl(mode: str, bounds: tuple[float | None, float | None]) -> None:
    for seed in range(2):
        batch = rollout(seed)
        expected, expected_metrics = trl_sampling_ratio(batch, mode, *bounds)
        ratio, metrics = sampling_ratio(
            jnp.asarray(batch.old),
            jnp.asarray(batch.sampling),
            jnp.asarray(batch.mask),
            mode=mode,  # type: ignore[arg-type]
            clip_min=bounds[0],
            clip_max=bounds[1],
        )
        np.testing.assert_allclose(np.asarray(ratio), expected.numpy(), atol=1e-12, rtol=1e-12)
        assert set(metrics) == set(expected_metrics)
        for name, value in expected_metrics.items():
            assert float(metrics[name]) == pytest.approx(value, rel=1e-6, abs=1e-6), name  # TRL logs float32
        bounded = np.asarray(ratio)[:, 0] if mode.startswith("sequence") else np.asarray(ratio)[batch.mask == 1]
        assert len(set(np.round(bounded, 9))) > 3  # the ratios differ, and not only at the bounds
        assert np.any(bounded != 1.0)


def test_sampling_correction_is_neutral_for_the_current_policy() -> None:
    """A rollout sampled by the policy that is trained (today's rollouts) has ratio 1, so the corrected
    loss and gradient are the uncorrected ones, for every loss."""
    batch = rollout(4)
    batch = Rollout(batch.logps, batch.old, batch.ref, batch.advantages, batch.mask, batch.old.copy())
    for loss_type in LOSS_TYPES:
        for mode in SAMPLING_CORRECTIONS:
            if loss_type == "vespo" and mode.startswith("sequence"):
                continue
            plain = ours(batch, **defaults({"loss_type": loss_type, "importance_sampling": "token", "beta": 0.0}))
            corrected = ours(
                batch,
                **defaults({"loss_type": loss_type, "importance_sampling": "token", "beta": 0.0})
                | {"sampling_correction": mode},
            )
            assert corrected[0] == pytest.approx(plain[0], abs=1e-12)
            np.testing.assert_allclose(corrected[1], plain[1], atol=1e-12)
            assert corrected[2]["sampling/importance_sampling_ratio/mean"] == 1.0


@pytest.mark.parametrize(
    "keys",
    [
        {"rl/loss": "vespo", "rl/vespo_k_neg": 1.5, "rl/vespo_lambda_pos": 0.5, "rl/sampling_correction_min": 0.5}
        | {"rl/sampling_correction_mode": "token_mask"},
        {"rl/loss": "sapo", "rl/sapo_temperature_neg": 3.0, "rl/sampling_correction_mode": "sequence_truncate"},
        {"rl/loss": "cispo", "rl/epsilon_high": CISPO_CAP, "rl/sampling_correction": False},
    ],
    ids=lambda keys: keys["rl/loss"],
)
def test_the_trainers_objective_takes_the_rl_keys(keys: dict[str, Any]) -> None:
    """``train/grpo``'s objective, built from ``rl/*`` keys, computes TRL's loss with TRL's options of the
    same names on a stale rollout (its ``sampling_logps``)."""
    from theseus.config import configuration, configure
    from theseus.model.rl.episodes import Limits
    from theseus.model.rl.rollout_source import RolloutConfig
    from theseus.model.rl.trainer import GRPOConfig, Policy
    from theseus.training.objective import Scores

    with configuration({"rl/max_new_tokens": WIDTH, "rl/epsilon_low": EPSILON_LOW} | keys):
        config, rollouts = configure(GRPOConfig), configure(RolloutConfig)
    config.check_policy_loss(config.loss, config.epsilon_high)
    single_turn = SimpleNamespace(STOP=())
    limits = Limits(rollouts.max_new_tokens, rollouts.max_turns, rollouts.max_episode_tokens, 2 * WIDTH)
    source = SimpleNamespace(limits=limits, environment=single_turn)
    trainer = SimpleNamespace(args=config, lora_rank=0, rollout_source=source)
    objective = Policy.for_trainer(trainer)
    batch = rollout(5)
    device_batch = {
        "x": jnp.zeros((ROWS, WIDTH), jnp.int32),
        "completion_mask": jnp.asarray(batch.mask, bool),
        "advantages": jnp.asarray(batch.advantages),
        "reward": jnp.asarray(batch.advantages),
        "sampling_logps": jnp.asarray(batch.sampling),
    }

    def loss_of(logps: jax.Array) -> tuple[jax.Array, dict[str, Any]]:
        scores = Scores(logps=logps, old_logps=jnp.asarray(batch.old), entropy=jnp.zeros_like(logps))
        return objective(scores, device_batch)

    (loss, _), grad = jax.value_and_grad(loss_of, has_aux=True)(jnp.asarray(batch.logps))
    options = dict(objective.options) | {"loss_type": config.loss, "importance_sampling": "token", "beta": 0.0}
    options |= {"epsilon_high": config.epsilon_high, "kl_ratio_correction": True, "delta": None}
    options |= {"max_completion_length": WIDTH, "num_items_in_batch": None}
    expected_loss, expected_grad, _ = trl_policy_loss(batch, **options)
    assert float(loss) == pytest.approx(expected_loss, abs=TOLERANCE, rel=TOLERANCE)
    np.testing.assert_allclose(np.asarray(grad), expected_grad, atol=TOLERANCE, rtol=0)
