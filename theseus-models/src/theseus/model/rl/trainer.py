"""``GRPOTrainer``: online reinforcement learning with group-relative advantages (the GRPO family).

Each step samples ``B`` prompts from the environment (``ENVIRONMENT``; ``environment=countdown``
selects another registered one, its keys under ``environment/<name>/``), generates
``rl/group_size`` completions for each with the policy's current parameters (the KV-cache decoder on
the trainer's mesh), scores them with the environment's weighted rewards (``rl/rewards``), turns the
scores into advantages within each prompt's group, and takes ``rl/updates_per_rollout`` updates of
the policy loss (``theseus.model.rl.loss.policy_loss``: ``rl/loss`` grpo | dr_grpo | dapo | bnpo | cispo
| sapo | luspo | vespo, ``rl/importance_sampling`` token | sequence) against the sampling policy's
log-probabilities.
``training/batch_size`` counts completions: ``B = training/batch_size / rl/group_size``. With
``rl/dynamic_sampling``, groups whose rewards are all equal are replaced by further rounds (DAPO).

Rollouts are a pure function of the parameters and ``(training/seed, step, round)``, so a killed or
preempted run resumes bit-exactly. LoRA (``model/lora/rank``), ``training/init_from`` and every
sharding layout work as in ``SFTTrainer``. Prompts are read with the tokenizer of the source the policy
starts from (a Hugging Face checkpoint's, ``training/init_from=hf:DIR``, or a run's; else the byte
tokenizer) and, with ``rl/chat``, rendered by its chat template; completions end at its end-of-text and
end-of-turn tokens (``theseus.model.rl.prompts``). An environment with stop strings plays episodes of
several turns, its replies masked from the loss (``theseus.model.rl.episodes``). With ``rl/beta > 0`` a
KL penalty to the reference is added: the policy with its LoRA adapters off, or, in full fine-tuning, a
frozen copy of the initial parameters (``theseus.model.rl.reference``).

Every step logs the reward (mean, std, and each reward's mean), accuracy, the completion length (mean
and max), entropy, the clipped fractions, the mean ratio and KL, the share of groups with equal
rewards, and the rollout's time, tokens per second and share of the step. Validation generates
greedily on the environment's ``eval`` split; its loss is the negative mean reward (so the best
checkpoint is the one that scores highest).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from theseus.config import configuration, configure, field
from theseus.data.chat import ChatTemplate
from theseus.errors import ConfigError
from theseus.model.finetune.trainer import SFTConfig, SFTTrainer
from theseus.model.generation.decode import Completion, generate_tokens
from theseus.model.generation.sampling import SamplingParams
from theseus.model.rl.episodes import SEED_RANGE, Episode, Limits, policy_turns, run_episodes, stop_strings
from theseus.model.rl.loss import IMPORTANCE_SAMPLING, LOSS_TYPES, group_advantages, policy_loss
from theseus.model.rl.options import PolicyLossOptions
from theseus.model.rl.prompts import PolicyText, policy_text
from theseus.model.rl.reference import REF_LOGPS, Reference
from theseus.model.rl.rollouts import LOGGED, SOLVED, Rollouts, completion_entropy, reward_means, rollout_metrics
from theseus.rl.completions import end_marker, reward_text
from theseus.rl.environment import Environment, Prompt, rng
from theseus.rl.rewards import COMPLETION_TOKENS, TRUNCATED
from theseus.rl.scoring import REWARD_ERRORS, REWARD_ERRORS_KEY, RewardFailure
from theseus.rl.selection import REWARDS_KEY, EnvironmentSelection, declared_environment, parse_weights, reward_config
from theseus.training import declarations
from theseus.training.base import Batch
from theseus.training.objective import Needs, Objective, Scores
from theseus.training.state import TrainState


@dataclass
class GRPOConfig(SFTConfig, PolicyLossOptions):
    """The environment, the rollouts and the policy loss."""

    rewards: str = field(
        REWARDS_KEY, default="", help="weighted rewards, name:weight,... (empty: the environment's own)"
    )
    reward_errors: str = field(
        REWARD_ERRORS_KEY,
        default="stop",
        choices=REWARD_ERRORS,
        help="a reward that raises on a completion: stop the run (one line), or zero (score it 0, count it)",
    )
    group_size: int = field("rl/group_size", default=4, min=2, help="completions per prompt (G)")
    max_new_tokens: int = field("rl/max_new_tokens", default=32, min=1, help="longest completion, in tokens")
    temperature: float = field("rl/temperature", default=1.0, above=0.0, help="sampling temperature of rollouts")
    top_p: float = field("rl/top_p", default=1.0, above=0.0, max=1.0, help="nucleus sampling of rollouts (1 = off)")
    loss: str = field(
        "rl/loss",
        default="grpo",
        choices=LOSS_TYPES,
        help="the policy loss: a clipped surrogate averaged as grpo, dr_grpo, dapo, bnpo or luspo; cispo, sapo, vespo",
    )
    importance_sampling: str = field(
        "rl/importance_sampling",
        default="token",
        choices=IMPORTANCE_SAMPLING,
        help="token (GRPO) or sequence (GSPO) ratios",
    )
    epsilon_low: float = field("rl/epsilon_low", default=0.2, min=0.0, below=1.0, help="lower clip of the ratio")
    epsilon_high: float = field(
        "rl/epsilon_high",
        default=0.2,
        min=0.0,
        help="upper clip (DAPO's clip-higher: 0.28); cispo: the ratio's cap (5)",
    )
    beta: float = field(
        "rl/beta",
        default=0.0,
        min=0.0,
        help="KL penalty to the reference (LoRA: the adapters off; full fine-tuning: the initial parameters)",
    )
    scale_rewards: bool = field(
        "rl/scale_rewards", default=True, help="divide advantages by the group's reward std (false: Dr. GRPO)"
    )
    updates: int = field(
        "rl/updates_per_rollout",
        default=1,
        min=1,
        help="optimizer updates on each batch of rollouts (mu), against the sampling policy's log-probabilities",
    )
    eval_temperature: float = field(
        "rl/eval_temperature", default=0.0, min=0.0, help="temperature of validation's completions (0: greedy)"
    )
    chat: bool = field(
        "rl/chat",
        default=False,
        help="render prompts with the chat template of the training/init_from run or checkpoint (false: plain text)",
    )
    max_turns: int = field(
        "rl/max_turns", default=4, min=1, help="policy turns per episode at most (environments with stop strings)"
    )
    max_episode_tokens: int = field(
        "rl/max_episode_tokens",
        default=0,
        min=0,
        help="tokens after the prompt per episode at most, turns and replies together (0: what the sequence holds)",
    )
    dynamic_sampling: bool = field(
        "rl/dynamic_sampling", default=False, help="drop groups whose rewards are all equal and refill them (DAPO)"
    )
    resample_rounds: int = field(
        "rl/resample_rounds", default=3, min=1, help="rounds of refills at most per step (rl/dynamic_sampling)"
    )


@dataclass(frozen=True)
class Policy(Objective):
    """The GRPO family's clipped-surrogate loss on scored rollouts (``rl/*``): ``updates`` updates on each
    batch, the later ones against the sampling policy's log-probabilities, with a KL penalty to the frozen
    base (the policy with its adapters off) when ``beta`` > 0, or with ``copied_reference`` to the frozen copy
    of the initial parameters whose log-probabilities the batch carries (``ref_logps``); a micro-batch
    weighs its completions."""

    loss: str = "grpo"
    level: str = "token"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    beta: float = 0.0
    max_completion_length: int = 32  # dr_grpo's normaliser: the most policy tokens an episode holds
    updates: int = 1
    copied_reference: bool = False
    options: tuple[tuple[str, Any], ...] = ()  # further policy_loss keywords (PolicyLossOptions)

    @property
    def needs(self) -> Needs:
        """The completions' log-probabilities and entropies, the old policy's, the reference's with a KL."""
        copied = self.beta > 0 and self.copied_reference
        rollout = ("completion_mask", "advantages", "reward", *((REF_LOGPS,) if copied else ()))
        frozen_base = self.beta > 0 and not copied
        return Needs("target_logps", entropy=True, batch=rollout, frozen_base=frozen_base, old_policy=True)

    def __call__(self, scores: Scores, batch: Batch) -> tuple[jax.Array, dict[str, Any]]:
        """The policy loss (``theseus.model.rl.loss.policy_loss``) and the rollout's metrics."""
        mask = batch["completion_mask"].astype(jnp.float32)
        loss, metrics = policy_loss(
            scores.logps,
            scores.old_logps,
            batch["advantages"],
            mask,
            loss_type=self.loss,  # type: ignore[arg-type]
            importance_sampling=self.level,  # type: ignore[arg-type]
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            beta=self.beta,
            ref_logps=batch[REF_LOGPS] if self.beta > 0 and self.copied_reference else scores.base_logps,
            max_completion_length=self.max_completion_length,
            num_items_in_batch=jnp.sum(mask),
            sampling_logps=batch.get("sampling_logps"),  # a rollout by another policy's (none yet)
            **dict(self.options),
        )
        logged = rollout_metrics(batch)
        logged["reward_std"] = jnp.std(batch["reward"])
        logged["entropy"] = completion_entropy(jax.lax.stop_gradient(scores.entropy), mask)
        return loss, {**metrics, **logged}

    def weight_of(self, batch: Batch) -> jax.Array:
        return jnp.asarray(batch["x"].shape[0], jnp.float32)


class GRPOTrainer(SFTTrainer):
    """GRPO-family training of ``MODEL`` (``model=`` selects another) on ``ENVIRONMENT`` (``environment=``
    selects another)."""

    CONFIG: ClassVar[type] = GRPOConfig
    DATASET: ClassVar[Any] = []
    ENVIRONMENT: ClassVar[Any] = "arithmetic"
    OBJECTIVE: ClassVar[Any] = None  # built from rl/* (objective())
    PLOTTED: ClassVar[Sequence[str]] = ("reward",)

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._environment: Environment | None = None
        self._rollout_ended: float | None = None  # perf_counter() when the last rollout was ready
        self._text: PolicyText | None = None  # the policy's tokenizer, chat template and stop tokens
        self._reference: Reference | None = None  # full fine-tuning with rl/beta > 0: the initial parameters
        self._reward_errors = 0  # completions a reward raised on since the last rollout (rl/reward_errors=zero)
        self._warned: set[str] = set()  # the warnings shown once per invocation

    # -- settings -------------------------------------------------------------------------------
    @classmethod
    def environment_class(cls) -> type[Environment]:
        return declared_environment(cls)

    @classmethod
    def config(cls) -> list[type]:
        """The trainer's keys, the environment's (``environment/<name>/...``) and those of every registered
        reward (``reward/<name>/...``: ``rl/rewards`` may name any)."""
        environment = cls.environment_class()
        return declarations.unique([*super().config(), EnvironmentSelection, environment, *reward_config()])

    def objective(self) -> Policy:
        """The policy loss of ``rl/*``."""
        a: GRPOConfig = self.args
        copied = a.beta > 0 and self.lora_rank <= 0
        return Policy(
            a.loss,
            a.importance_sampling,
            a.epsilon_low,
            a.epsilon_high,
            a.beta,
            self.limits.longest_completion(multi_turn=bool(stop_strings(self.environment))),
            a.updates,
            copied_reference=copied,
            options=a.policy_loss_options(),
        )

    def updates_per_step(self) -> int:
        return int(self.args.updates)

    @property
    def environment(self) -> Environment:
        if self._environment is None:
            with configuration(self.context.config):
                self._environment = configure(self.environment_class())
        return self._environment

    @property
    def limits(self) -> Limits:
        """The length limits of an episode: ``rl/max_new_tokens``, ``rl/max_turns``, ``rl/max_episode_tokens``."""
        a: GRPOConfig = self.args
        return Limits(a.max_new_tokens, a.max_turns, a.max_episode_tokens, self.sequence_length)

    @functools.cached_property
    def weights(self) -> dict[str, float]:
        """The rewards scored and their weights: ``rl/rewards``, else the environment's own."""
        text = self.args.rewards
        return parse_weights(text) if text else dict(self.environment.REWARDS)

    def setup(self) -> None:
        if self._ready:
            return
        super().setup()
        a: GRPOConfig = self.args
        a.check_policy_loss(a.loss, a.epsilon_high)
        if a.batch_size % a.group_size:
            raise ConfigError(
                f"training/batch_size={a.batch_size} completions do not split into groups of rl/group_size="
                f"{a.group_size}; make the batch a multiple of the group size"
            )
        if self.accumulate_steps > 1:
            raise ConfigError(
                f"{type(self).__qualname__} takes one update per batch of rollouts; leave training/micro_batch_size "
                "unset (gradient accumulation is not supported yet)"
            )
        vocab = int(self.setting("architecture/vocab_size", 0) or 0)
        tokenizer = self.tokenizer()
        if vocab < tokenizer.vocab_size:
            named = "byte tokenizer's" if tokenizer.spec.get("kind") == "byte" else "tokenizer's"
            raise ConfigError(
                f"architecture/vocab_size={vocab} is smaller than the {named} {tokenizer.vocab_size}; "
                f"set architecture/vocab_size={tokenizer.vocab_size} or more"
            )
        if a.beta > 0 and self.lora_rank <= 0:
            self._reference = Reference(self)  # full fine-tuning: a frozen copy of the initial parameters
        if a.rewards:  # unknown reward names fail before anything runs
            parse_weights(a.rewards)
        self._encode(self.environment.prompts("train", a.seed, 0, a.batch_size // a.group_size))  # room to answer

    def prepare_to_run(self) -> None:
        """The rewards load what they need (``Reward.prepare``: ``reward/model`` its run) before the first
        rollout, so one that cannot work fails before anything is generated."""
        super().prepare_to_run()
        with configuration(self.context.config):
            self.environment.prepare_rewards(self.weights)

    # -- rollouts -------------------------------------------------------------------------------
    def batch(self, slice: str = "train") -> Batch:
        """The rollouts of the current step: prompts of the environment, completions of the policy."""
        if slice != "train":
            raise ConfigError(f"{type(self).__qualname__} validates by generating; it has no {slice!r} batches")
        return self.rollouts(self.position("train"))

    def rollouts(self, step: int) -> dict[str, np.ndarray]:
        """Generate, score and arrange the completions of step ``step``; this process's rows. Every
        process generates and scores the whole batch (the decoder splits its rows over the mesh) and
        keeps its share, so advantages see every completion of a group."""
        a: GRPOConfig = self.args
        if self.state is not None:  # the previous update done, so its time is not counted as the rollout's
            jax.block_until_ready(self.state.params)
        began = time.perf_counter()
        update_seconds = began - self._rollout_ended if self._rollout_ended is not None else 0.0
        self._reward_errors = 0
        done, dropped = self._sample(step)
        if isinstance(self.objective(), Policy) and not any(group.varied() for group in done.groups(a.group_size)):
            self._warn_flat(step)  # the policy gradient needs advantages (distillation's loss does not)
        advantages = group_advantages(jnp.asarray(done.rewards, jnp.float32), a.group_size, scale=a.scale_rewards)
        batch = self._arrange(done.prompts, done.completions, done.masks)
        if self._reference is not None:  # full fine-tuning's frozen reference, once per rollout
            batch[REF_LOGPS] = self._reference.logps(batch)
        self._rollout_ended = time.perf_counter()
        seconds = self._rollout_ended - began
        generated = sum(sum(m) for m in done.masks)
        rows = len(done.rewards)

        def column(value: float) -> np.ndarray:
            return np.full(rows, value, np.float32)

        batch.update(
            advantages=np.asarray(advantages, np.float32),
            reward=np.asarray(done.rewards, np.float32),
            rollout_seconds=column(seconds),
            rollout_tokens_per_s=column(generated / max(seconds, 1e-9)),
            update_seconds=column(update_seconds),
            rollout_share=column(seconds / (seconds + update_seconds)),
            groups_dropped=column(dropped),
            turns=np.asarray([policy_turns(m) for m in done.masks], np.float32),
            reward_errors=column(self._reward_errors),
            **{f"reward/{name}": np.asarray(v, np.float32) for name, v in done.per_reward.items()},
        )
        solved = self.environment.solved(done.per_reward)
        if solved is not None:
            batch[SOLVED] = np.asarray(solved, np.float32)
        first = self.sharding.feed_index * self.batch_rows
        return {name: value[first : first + self.batch_rows] for name, value in batch.items()}

    def _sample(self, step: int) -> tuple[Rollouts, float]:
        """The scored rollouts of ``step`` and the fraction of generated groups whose rewards were all
        equal (0 without dynamic sampling). With ``rl/dynamic_sampling``, such groups (no advantage to
        learn from) are dropped and refilled from further rounds of the same size (new prompts and
        samples keyed by ``(seed, step, round)``), up to ``rl/resample_rounds``; places still empty then
        keep dropped groups."""
        a: GRPOConfig = self.args
        count = a.batch_size // a.group_size
        first = self._generate(step, 0, count)
        if not a.dynamic_sampling:
            return first, 0.0
        kept: list[Rollouts] = []
        spare: list[Rollouts] = []
        drawn = 0
        for attempt in range(a.resample_rounds + 1):
            batch = first if attempt == 0 else self._generate(step, attempt, count)
            for group in batch.groups(a.group_size):
                (kept if group.varied() else spare).append(group)
            drawn += count
            if len(kept) >= count:
                break
        return Rollouts.join((kept + spare)[:count]), len(spare) / drawn

    def _generate(self, step: int, attempt: int, count: int) -> Rollouts:
        """``count`` prompts of the train split with ``rl/group_size`` scored completions each: attempt 0
        is the step's own draw, later ones (dynamic sampling's refill rounds) draw from seeds of their own."""
        a: GRPOConfig = self.args
        seed = (a.seed * 1_000_003 + step) % SEED_RANGE
        prompt_seed = a.seed
        if attempt:
            seed = rng("rollout", a.seed, step, attempt).randrange(SEED_RANGE)
            prompt_seed = rng("refill", a.seed, attempt).randrange(SEED_RANGE)
        prompts = self.environment.prompts("train", prompt_seed, step, count)
        rows = [p for p in prompts for _ in range(a.group_size)]
        sampling = SamplingParams(temperature=a.temperature, top_p=a.top_p)
        return self._played(rows, self._complete(rows, sampling, seed=seed))

    def _played(self, prompts: list[Prompt], episodes: list[Episode]) -> Rollouts:
        """The episodes of ``prompts`` scored: the rewards read the policy's text."""
        stopped = [e.stopped for e in episodes]
        texts, written = [e.text for e in episodes], [e.policy_tokens for e in episodes]
        total, per_reward = self._score(prompts, texts, written, [not e.truncated for e in episodes])
        completions, masks = [e.tokens for e in episodes], [e.learned for e in episodes]
        return Rollouts([e.prompt for e in episodes], completions, stopped, total, per_reward, masks)

    def _complete(self, prompts: list[Prompt], sampling: SamplingParams, seed: int) -> list[Episode]:
        """The episodes of ``prompts`` played by the current parameters (``self.state``: the training loop
        keeps it current; the initial state before the first update): one turn each, or several with an
        environment that answers stop strings (``theseus.model.rl.episodes``). A prompt that leaves no
        room for ``rl/max_new_tokens`` is refused before anything is generated."""
        text, encoded = self.policy_text, self._encode(prompts)
        if self.state is None:
            self.state = self.init_state()
        params = self.state.params

        def generate(contexts: list[list[int]], new: int, width: int, turn_seed: int) -> list[Completion]:
            return generate_tokens(
                self.model,
                params,
                contexts,
                new,
                sampling=sampling,
                seed=turn_seed,
                eot_id=text.stop_ids[0],
                stop_ids=text.stop_ids,
                width=width,
                sharding=self.sharding,
            )

        return run_episodes(generate, text, self.environment, prompts, encoded, self.limits, seed)

    def _encode(self, prompts: list[Prompt]) -> list[list[int]]:
        """The prompts' token ids (``PolicyText``: chat-rendered or plain, in the policy's tokenizer); a
        prompt that leaves no room for ``rl/max_new_tokens`` in the sequence, or an empty one, is one
        ConfigError line."""
        new = self.args.max_new_tokens
        encoded = [self.policy_text.encode(p) for p in prompts]
        longest = max(len(e) for e in encoded)
        if min(len(e) for e in encoded) == 0:
            raise ConfigError(
                f"environment {type(self.environment).__name__!r} gave an empty prompt; it must give text"
            )
        if longest + new > self.sequence_length:
            raise ConfigError(
                f"a prompt of {longest} tokens and rl/max_new_tokens={new} need training/sequence_length>="
                f"{longest + new} (and architecture/block_size); raise it or lower rl/max_new_tokens"
            )
        return encoded

    @property
    def policy_text(self) -> PolicyText:
        """The policy's tokenizer, chat template (``rl/chat``) and stop tokens, those of the source it
        starts from (``theseus.model.rl.prompts``)."""
        if self._text is None:
            self.setup()
            source = self.init_source.tokenizer if self.init_source is not None else None
            self._text = policy_text(str(self.args.init_from or ""), self.context.root, source, self.args.chat)
        return self._text

    @property
    def _template(self) -> ChatTemplate | None:
        """The chat template prompts are rendered with (``rl/chat``), else None."""
        return self.policy_text.template

    def tokenizer(self) -> Any:
        """The policy's tokenizer: the source's (``training/init_from``), else the byte tokenizer."""
        return self.policy_text.tokenizer

    def chat_template(self) -> dict[str, str] | None:
        """The template of ``rl/chat``, kept in this run's folder too (``generate/chat=true`` uses it)."""
        template = self._template
        if template is None:
            return None
        return {"chat_template": template.source, "bos_token": template.bos_token, "eos_token": template.eos_token}

    def _score(
        self, prompts: list[Prompt], texts: list[str], tokens: Sequence[Sequence[int]], ended: list[bool]
    ) -> tuple[list[float], dict[str, list[float]]]:
        """The environment's weighted rewards (configured from the run's keys) of the completions' texts up
        to the chat template's end marker (``reward_text``); each completion's length in tokens and whether
        it was cut at ``rl/max_new_tokens`` reach the rewards as ``metadata["completion_tokens"]`` and
        ``metadata["truncated"]``. A reward that raises stops the run or scores 0 (``rl/reward_errors``)."""
        marker = end_marker(self._template) if self._template is not None else ""
        answers, scored = [], []
        for p, text, t, finished in zip(prompts, texts, tokens, ended, strict=True):
            answer, truncated = reward_text(text, finished, marker)
            answers.append(answer)
            scored.append(Prompt(p.text, {**p.metadata, COMPLETION_TOKENS: len(t), TRUNCATED: truncated}, p.system))
        with configuration(self.context.config):
            done = self.environment.scored(scored, answers, self.weights, on_error=self.args.reward_errors)
        self._reward_errors += len(done.failures)
        for failure in done.failures:
            self._warn_failure(failure)
        return done.total, done.per_reward

    def _warn(self, key: str, line: str) -> None:
        """Print the warning ``line`` on process 0, once per invocation for each ``key``."""
        if key not in self._warned and jax.process_index() == 0:
            print(line, file=sys.stderr, flush=True)
        self._warned.add(key)

    def _warn_failure(self, failure: RewardFailure) -> None:
        """The first failure of each reward (``rl/reward_errors=zero``), in one line."""
        self._warn(
            f"reward:{failure.reward}",
            f"warning: {failure.describe()}; scored 0 ({REWARD_ERRORS_KEY}=zero); the metric reward_errors counts "
            "such completions at each step",
        )

    def _warn_flat(self, step: int) -> None:
        """Once: every group of the rollout at data position ``step`` (update ``step + 1``) scored the same
        within itself, so the update has no gradient."""
        a: GRPOConfig = self.args
        fix = (
            f"rl/dynamic_sampling found no group that scores apart in rl/resample_rounds={a.resample_rounds} "
            "rounds; raise it"
            if a.dynamic_sampling
            else "set rl/dynamic_sampling=true to drop such groups and refill them"
        )
        self._warn(
            "flat",
            f"warning: at step {step + 1} every group's completions scored the same, so their advantages and the "
            f"policy gradient are 0; {fix}, or give the reward partial credit or the environment easier prompts "
            "(shown once)",
        )

    def _arrange(
        self, prompts: list[list[int]], completions: list[list[int]], masks: list[list[bool]] | None = None
    ) -> dict[str, np.ndarray]:
        """Rows ``prompt + completion`` (its stop token included) from position 0, right-padded to the
        sequence length: ``x``, ``y``, ``padding_mask``, ``completion_mask`` (the ``y`` positions of tokens
        the policy wrote: ``masks``, else every completion token; an environment's reply is not one) and
        ``completion_length``."""
        length = self.sequence_length
        rows = len(prompts)
        x = np.zeros((rows, length), np.int32)
        y = np.zeros((rows, length), np.int32)
        real = np.zeros((rows, length), bool)
        target = np.zeros((rows, length), bool)
        for i, (ids, completion) in enumerate(zip(prompts, completions, strict=True)):
            sequence = ids + completion
            n = len(sequence) - 1
            x[i, :n], y[i, :n], real[i, :n] = sequence[:-1], sequence[1:], True
            target[i, len(ids) - 1 : n] = masks[i] if masks else True
        lengths = target.sum(axis=1).astype(np.float32)
        return {"x": x, "y": y, "padding_mask": real, "completion_mask": target, "completion_length": lengths}

    def abstract_train_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        batch = super().abstract_train_batch()
        rows = (self.accumulate_steps, self.micro_rows)
        per_row = self.sharding.batch_sharding(len(rows), leading=1)
        shape = (*rows, self.sequence_length)
        batch["padding_mask"] = jax.ShapeDtypeStruct(shape, jnp.bool_, sharding=batch["x"].sharding)
        batch["completion_mask"] = jax.ShapeDtypeStruct(shape, jnp.bool_, sharding=batch["x"].sharding)
        names = ["advantages", *LOGGED]
        names += [f"reward/{name}" for name in self.weights]
        names += [SOLVED] if self.environment.ACCURACY in self.weights else []
        for name in names:
            batch[name] = jax.ShapeDtypeStruct(rows, jnp.float32, sharding=per_row)
        if self._reference is not None:
            batch[REF_LOGPS] = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=batch["x"].sharding)
        return batch

    # -- validation -----------------------------------------------------------------------------
    def validate(self, state: TrainState, batches: int | None = None, slice: str = "val") -> dict[str, Any]:
        """Completions of ``batches`` x B prompts of the environment's ``eval`` split, greedy or at
        ``rl/eval_temperature``: the mean reward, each reward's mean, accuracy, and ``loss`` = -mean reward."""
        a: GRPOConfig = self.args
        batches = a.eval_batches if batches is None else batches
        done = self.eval_rollouts(state, batches, self.args.batch_size // a.group_size)
        result = {"loss": -float(np.mean(done.rewards)), **reward_means(done, self.environment)}
        result["tokens"] = float(len(done.rewards))
        return result

    def eval_rollouts(self, state: TrainState, batches: int, count: int) -> Rollouts:
        """``batches`` x ``count`` prompts of the environment's ``eval`` split completed by ``state``'s
        parameters, greedily or at ``rl/eval_temperature``, and scored."""
        a: GRPOConfig = self.args
        prompts = [p for index in range(batches) for p in self.environment.prompts("eval", a.seed, index, count)]
        self.state = state
        sampling = SamplingParams(temperature=a.eval_temperature)
        return self._played(prompts, self._complete(prompts, sampling, seed=a.seed))


__all__ = ["GRPOConfig", "GRPOTrainer", "Policy"]
