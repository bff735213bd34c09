"""``GRPOTrainer``: online reinforcement learning with group-relative advantages (the GRPO family).

Each step samples ``B`` prompts from the environment (``ENVIRONMENT``; ``environment=countdown``
selects another registered one, its keys under ``environment/<name>/``), generates
``rl/group_size`` completions for each with the policy's current parameters (the KV-cache decoder on
the trainer's mesh), scores them with the environment's weighted rewards (``rl/rewards``), turns the
scores into advantages within each prompt's group, and takes ``rl/updates_per_rollout`` updates of
the clipped-surrogate loss (``theseus.model.rl.loss.policy_loss``: ``rl/loss`` grpo | dr_grpo | dapo
| bnpo, ``rl/importance_sampling`` token | sequence) against the sampling policy's log-probabilities.
``training/batch_size`` counts completions: ``B = training/batch_size / rl/group_size``. With
``rl/dynamic_sampling``, groups whose rewards are all equal are replaced by further rounds (DAPO).

Rollouts are a pure function of the parameters and ``(training/seed, step, round)``, so a killed or
preempted run resumes bit-exactly. LoRA (``model/lora/rank``), ``training/init_from`` and every
sharding layout work as in ``SFTTrainer``; ``rl/chat`` renders prompts with the chat template of the
run the policy starts from. With ``rl/beta > 0`` a KL penalty to the reference, the policy with its
LoRA adapters off, is added.

Every step logs the reward (mean, std, and each reward's mean), accuracy, the completion length (mean
and max), entropy, the clipped fractions, the mean ratio and KL, the share of groups with equal
rewards, and the rollout's time, tokens per second and share of the step. Validation generates
greedily on the environment's ``eval`` split; its loss is the negative mean reward (so the best
checkpoint is the one that scores highest).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from theseus.config import configuration, configure, field
from theseus.data.chat import ChatTemplate
from theseus.errors import ConfigError
from theseus.model.finetune.chat import TEMPLATE_FILE
from theseus.model.finetune.trainer import SFTConfig, SFTTrainer
from theseus.model.generation.decode import generate_tokens
from theseus.model.generation.sampling import SamplingParams
from theseus.model.rl.loss import IMPORTANCE_SAMPLING, LOSS_TYPES, group_advantages, policy_loss
from theseus.rl.environment import Environment, Prompt, rng
from theseus.rl.rewards import COMPLETION_TOKENS
from theseus.rl.selection import REWARDS_KEY, EnvironmentSelection, declared_environment, parse_weights, reward_config
from theseus.runs.ref import RunRef
from theseus.training import declarations
from theseus.training.base import Batch
from theseus.training.objective import Needs, Objective, Scores
from theseus.training.sources import parse_source
from theseus.training.state import TrainState

#: The rollout's sampling seed is kept below 2**31 (the decoder takes an int32).
SEED_RANGE = 2**31
#: Prompts are left-padded to a multiple of this many tokens, so that the decoder compiles once for
#: prompts of similar lengths.
WIDTH_STEP = 32


@dataclass
class GRPOConfig(SFTConfig):
    """The environment, the rollouts and the clipped-surrogate objective."""

    rewards: str = field(
        REWARDS_KEY, default="", help="weighted rewards, name:weight,... (empty: the environment's own)"
    )
    group_size: int = field("rl/group_size", default=4, min=2, help="completions per prompt (G)")
    max_new_tokens: int = field("rl/max_new_tokens", default=32, min=1, help="longest completion, in tokens")
    temperature: float = field("rl/temperature", default=1.0, above=0.0, help="sampling temperature of rollouts")
    top_p: float = field("rl/top_p", default=1.0, above=0.0, max=1.0, help="nucleus sampling of rollouts (1 = off)")
    loss: str = field("rl/loss", default="grpo", choices=LOSS_TYPES, help="grpo | dr_grpo | dapo | bnpo aggregation")
    importance_sampling: str = field(
        "rl/importance_sampling",
        default="token",
        choices=IMPORTANCE_SAMPLING,
        help="token (GRPO) or sequence (GSPO) ratios",
    )
    epsilon_low: float = field("rl/epsilon_low", default=0.2, min=0.0, below=1.0, help="lower clip of the ratio")
    epsilon_high: float = field("rl/epsilon_high", default=0.2, min=0.0, help="upper clip (DAPO's clip-higher: 0.28)")
    beta: float = field("rl/beta", default=0.0, min=0.0, help="KL penalty to the reference (LoRA runs: adapters off)")
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
        help="render prompts with the chat template the training/init_from run trained with (false: plain text)",
    )
    dynamic_sampling: bool = field(
        "rl/dynamic_sampling", default=False, help="drop groups whose rewards are all equal and refill them (DAPO)"
    )
    resample_rounds: int = field(
        "rl/resample_rounds", default=3, min=1, help="rounds of refills at most per step (rl/dynamic_sampling)"
    )


@dataclass
class Rollouts:
    """Scored completions, each prompt's ``rl/group_size`` consecutive: token ids of prompts and
    completions, whether each stopped at the end of text, the weighted reward and each reward's score."""

    prompts: list[list[int]]
    completions: list[list[int]]
    stopped: list[bool]
    rewards: list[float]
    per_reward: dict[str, list[float]]

    def groups(self, size: int) -> list[Rollouts]:
        """One ``Rollouts`` per prompt."""
        return [self._rows(slice(i, i + size)) for i in range(0, len(self.rewards), size)]

    def varied(self) -> bool:
        """Whether the rewards differ (a group whose rewards are all equal has no advantage)."""
        return len(set(self.rewards)) > 1

    def _rows(self, rows: slice) -> Rollouts:
        per_reward = {name: v[rows] for name, v in self.per_reward.items()}
        return Rollouts(self.prompts[rows], self.completions[rows], self.stopped[rows], self.rewards[rows], per_reward)

    @staticmethod
    def join(parts: list[Rollouts]) -> Rollouts:
        """The rows of ``parts`` in order."""
        names = parts[0].per_reward
        return Rollouts(
            [p for part in parts for p in part.prompts],
            [c for part in parts for c in part.completions],
            [s for part in parts for s in part.stopped],
            [r for part in parts for r in part.rewards],
            {name: [v for part in parts for v in part.per_reward[name]] for name in names},
        )


#: Per-row batch entries that are logged as their mean (rewards, lengths, rollout timing).
LOGGED = (
    "reward",
    "completion_length",
    "rollout_seconds",
    "rollout_tokens_per_s",
    "update_seconds",
    "rollout_share",
    "groups_dropped",
)


def solved(correct: Any) -> Any:
    """Which completions the ``correct`` reward scores as right (its score 1)."""
    return correct >= 1.0


def rollout_metrics(batch: Batch) -> dict[str, jax.Array]:
    """The means of a rollout's per-row entries (rewards, length, timing), the longest completion, and
    ``accuracy`` where the ``correct`` reward was scored."""
    logged = {name: jnp.mean(batch[name]) for name in batch if name in LOGGED or name.startswith("reward/")}
    if "completion_length" in batch:
        logged["completion_length_max"] = jnp.max(batch["completion_length"])
    if "reward/correct" in batch:
        logged["accuracy"] = jnp.mean(solved(batch["reward/correct"]))
    return logged


def reward_means(done: Rollouts) -> dict[str, float]:
    """What validation reports of scored completions: ``reward`` and each reward's mean, and
    ``accuracy`` where the ``correct`` reward was scored."""
    result = {"reward": float(np.mean(done.rewards))}
    result.update({f"reward/{name}": float(np.mean(v)) for name, v in done.per_reward.items()})
    if "correct" in done.per_reward:
        result["accuracy"] = float(np.mean(solved(np.asarray(done.per_reward["correct"]))))
    return result


def completion_entropy(entropy: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean over the masked positions of the policy's per-position entropies (nats)."""
    return jnp.sum(entropy * mask) / jnp.maximum(jnp.sum(mask), 1.0)


@dataclass(frozen=True)
class Policy(Objective):
    """The GRPO family's clipped-surrogate loss on scored rollouts (``rl/*``): ``updates`` updates on each
    batch, the later ones against the sampling policy's log-probabilities, with a KL penalty to the frozen
    base (the policy with its adapters off) when ``beta`` > 0; a micro-batch weighs its completions."""

    loss: str = "grpo"
    level: str = "token"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    beta: float = 0.0
    max_new_tokens: int = 32
    updates: int = 1

    @property
    def needs(self) -> Needs:
        """The completions' log-probabilities and entropies, the old policy's, the frozen base's with a KL."""
        rollout = ("completion_mask", "advantages", "reward")
        return Needs("target_logps", entropy=True, batch=rollout, frozen_base=self.beta > 0, old_policy=True)

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
            ref_logps=scores.base_logps,
            max_completion_length=self.max_new_tokens,
            num_items_in_batch=jnp.sum(mask),
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
        self._template: ChatTemplate | None = None  # rl/chat: the template prompts are rendered with

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
        return Policy(a.loss, a.importance_sampling, a.epsilon_low, a.epsilon_high, a.beta, a.max_new_tokens, a.updates)

    def updates_per_step(self) -> int:
        return int(self.args.updates)

    @property
    def environment(self) -> Environment:
        if self._environment is None:
            with configuration(self.context.config):
                self._environment = configure(self.environment_class())
        return self._environment

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
        if str(a.init_from).startswith("hf:"):
            raise ConfigError(
                f"training/init_from={a.init_from}: {type(self).__qualname__} reads prompts with the byte tokenizer, "
                "not the checkpoint's; start from a run trained on byte-tokenized data (run:NAME)"
            )
        vocab = int(self.setting("architecture/vocab_size", 0) or 0)
        if vocab < self.tokenizer().vocab_size:
            raise ConfigError(
                f"architecture/vocab_size={vocab} is smaller than the byte tokenizer's {self.tokenizer().vocab_size}; "
                f"set architecture/vocab_size={self.tokenizer().vocab_size} or more"
            )
        if a.beta > 0 and self.lora_rank <= 0:
            raise ConfigError(
                f"rl/beta={a.beta} needs a reference: the policy with its LoRA adapters off; set model/lora/rank>0, "
                "or rl/beta=0"
            )
        if a.chat:
            self._template = self._init_template()
        if a.rewards:  # unknown reward names fail before anything runs
            parse_weights(a.rewards)
        self._encode(self.environment.prompts("train", a.seed, 0, a.batch_size // a.group_size))  # room to answer

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
        done, dropped = self._sample(step)
        advantages = group_advantages(jnp.asarray(done.rewards, jnp.float32), a.group_size, scale=a.scale_rewards)
        batch = self._arrange(done.prompts, done.completions, done.stopped)
        self._rollout_ended = time.perf_counter()
        seconds = self._rollout_ended - began
        generated = sum(len(c) for c in done.completions)
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
            **{f"reward/{name}": np.asarray(v, np.float32) for name, v in done.per_reward.items()},
        )
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
        encoded, completions, stopped, texts = self._complete(rows, sampling, seed=seed)
        total, per_reward = self._score(rows, texts, completions)
        return Rollouts(encoded, completions, stopped, total, per_reward)

    def _complete(
        self, prompts: list[Prompt], sampling: SamplingParams, seed: int
    ) -> tuple[list[list[int]], list[list[int]], list[bool], list[str]]:
        """``(prompt ids, completion ids, stopped, completion texts)`` of ``prompts`` from the current
        parameters (``self.state``: the training loop keeps it current; the initial state before the
        first update). A prompt that leaves no room for ``rl/max_new_tokens`` is refused before
        anything is generated."""
        tokenizer, new = self.tokenizer(), self.args.max_new_tokens
        encoded = self._encode(prompts)
        # prompt widths rounded up to a multiple of WIDTH_STEP: one decoder compile serves many steps
        longest = min(-(-max(len(e) for e in encoded) // WIDTH_STEP) * WIDTH_STEP, self.sequence_length - new)
        if self.state is None:
            self.state = self.init_state()
        done = generate_tokens(
            self.model,
            self.state.params,
            encoded,
            new,
            sampling=sampling,
            seed=seed,
            eot_id=tokenizer.eot_id,
            width=longest,
            sharding=self.sharding,
        )
        tokens = [list(c.tokens) for c in done]
        return encoded, tokens, [bool(c.stopped) for c in done], [tokenizer.decode(t) for t in tokens]

    def _encode(self, prompts: list[Prompt]) -> list[list[int]]:
        """The prompts' token ids (``_prompt_text``: chat-rendered or plain); a prompt that leaves no room
        for ``rl/max_new_tokens`` in the sequence, or an empty one, is one ConfigError line."""
        tokenizer, new = self.tokenizer(), self.args.max_new_tokens
        encoded = [list(tokenizer.encode(self._prompt_text(p))) for p in prompts]
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

    def _prompt_text(self, prompt: Prompt) -> str:
        """The text the policy continues: the prompt's messages through the chat template with its
        generation prompt (``rl/chat``), else the plain text after a system message on its own line."""
        if self._template is not None:
            return self._template.render(prompt.messages, add_generation_prompt=True)
        return f"{prompt.system}\n{prompt.text}" if prompt.system else prompt.text

    def _kept_template(self) -> Path | None:
        """``chat_template.json`` of the ``training/init_from`` run (None when it is not a run)."""
        spec = str(self.args.init_from)
        source = parse_source(spec, self.context.root) if spec.startswith("run:") else None
        return source.path / TEMPLATE_FILE if isinstance(source, RunRef) else None

    def _init_template(self) -> ChatTemplate:
        """The chat template kept by the ``training/init_from`` run (``rl/chat=true``)."""
        kept = self._kept_template()
        if kept is None or not kept.is_file():
            spec = str(self.args.init_from)
            raise ConfigError(
                f"rl/chat=true renders prompts with the chat template of the run the policy starts from, but "
                f"training/init_from={spec or '(unset)'} {'is not a run' if kept is None else 'has none'}; "
                "start from a run fine-tuned on chat data (training/init_from=run:NAME) or set rl/chat=false"
            )
        return ChatTemplate.from_tokenizer_config(kept)

    def chat_template(self) -> dict[str, str] | None:
        """The template of ``rl/chat``, kept in this run's folder too (``generate/chat=true`` uses it)."""
        kept = self._kept_template() if self.args.chat else None
        if kept is None:
            return None
        found: dict[str, str] = json.loads(kept.read_text(encoding="utf-8"))
        return found

    def _score(
        self, prompts: list[Prompt], texts: list[str], tokens: list[list[int]]
    ) -> tuple[list[float], dict[str, list[float]]]:
        """The environment's weighted rewards (configured from the run's keys); each completion's
        length in tokens reaches the rewards as ``metadata["completion_tokens"]``."""
        scored = [
            Prompt(p.text, {**p.metadata, COMPLETION_TOKENS: len(t)}, p.system)
            for p, t in zip(prompts, tokens, strict=True)
        ]
        with configuration(self.context.config):
            return self.environment.score(scored, texts, self.weights)

    def _arrange(
        self, prompts: list[list[int]], completions: list[list[int]], stopped: list[bool]
    ) -> dict[str, np.ndarray]:
        """Rows ``prompt + completion (+ end of text where it stopped)`` from position 0, right-padded to
        the sequence length: ``x``, ``y``, ``padding_mask``, ``completion_mask`` (the ``y`` positions that
        are completion tokens) and ``completion_length``."""
        eot, length = self.tokenizer().eot_id, self.sequence_length
        rows = len(prompts)
        x = np.zeros((rows, length), np.int32)
        y = np.zeros((rows, length), np.int32)
        real = np.zeros((rows, length), bool)
        target = np.zeros((rows, length), bool)
        for i, (ids, completion, ended) in enumerate(zip(prompts, completions, stopped, strict=True)):
            sequence = ids + completion + ([eot] if ended else [])
            n = len(sequence) - 1
            x[i, :n], y[i, :n], real[i, :n] = sequence[:-1], sequence[1:], True
            target[i, len(ids) - 1 : n] = True
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
        for name in names:
            batch[name] = jax.ShapeDtypeStruct(rows, jnp.float32, sharding=per_row)
        return batch

    # -- validation -----------------------------------------------------------------------------
    def validate(self, state: TrainState, batches: int | None = None, slice: str = "val") -> dict[str, Any]:
        """Completions of ``batches`` x B prompts of the environment's ``eval`` split, greedy or at
        ``rl/eval_temperature``: the mean reward, each reward's mean, accuracy, and ``loss`` = -mean reward."""
        a: GRPOConfig = self.args
        batches = a.eval_batches if batches is None else batches
        done = self.eval_rollouts(state, batches, self.args.batch_size // a.group_size)
        result = {"loss": -float(np.mean(done.rewards)), **reward_means(done)}
        result["tokens"] = float(len(done.rewards))
        return result

    def eval_rollouts(self, state: TrainState, batches: int, count: int) -> Rollouts:
        """``batches`` x ``count`` prompts of the environment's ``eval`` split completed by ``state``'s
        parameters, greedily or at ``rl/eval_temperature``, and scored."""
        a: GRPOConfig = self.args
        prompts = [p for index in range(batches) for p in self.environment.prompts("eval", a.seed, index, count)]
        self.state = state
        sampling = SamplingParams(temperature=a.eval_temperature)
        encoded, tokens, stopped, texts = self._complete(prompts, sampling, seed=a.seed)
        total, per_reward = self._score(prompts, texts, tokens)
        return Rollouts(encoded, tokens, stopped, total, per_reward)


__all__ = ["GRPOConfig", "GRPOTrainer", "Policy"]
