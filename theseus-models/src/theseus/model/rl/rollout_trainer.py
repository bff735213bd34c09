"""``RolloutTrainer``: what the on-policy trainers (``train/grpo``, ``train/distill``) share. Each holds a
``RolloutSource`` built at set-up from its keys (``ROLLOUTS``) and learns from batches of its rollouts:
every step the source samples with the current parameters, and the rows it arranges carry the rollout's
metrics (rewards, lengths, turns, timing); a subclass adds what its objective reads (``rollout_rows``).
With ``rl/log_completions`` the first rollouts of each step are kept as records and written to the run
folder and the trackers (``theseus.model.rl.rollout_log``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from theseus.config import configuration, configure
from theseus.errors import ConfigError
from theseus.model.finetune.trainer import SFTTrainer
from theseus.model.rl.prompts import found_template, policy_text, template_record
from theseus.model.rl.rollout_log import RolloutLog, rollout_records
from theseus.model.rl.rollout_producer import RolloutProducer
from theseus.model.rl.rollout_source import RolloutConfig, RolloutSource, Sampled
from theseus.model.rl.rollouts import LOGGED, Rollouts
from theseus.rl.environment import Environment
from theseus.rl.selection import declared_environment
from theseus.training import declarations, packing
from theseus.training.base import Batch
from theseus.training.sharding import TrainerSharding, build_sharding
from theseus.training.state import TrainState

#: The key of the devices rollouts take for themselves.
ROLLOUT_DEVICES = "rl/rollout_devices"


@dataclass(frozen=True)
class Made:
    """A step's rollouts as sampled and as batch rows, and the seconds they took to make."""

    sampled: Sampled
    batch: dict[str, np.ndarray]
    seconds: float


class RolloutTrainer(SFTTrainer):
    """Training of ``MODEL`` on the policy's own scored rollouts of ``ENVIRONMENT`` (``environment=``
    selects another), their keys those of ``ROLLOUTS``."""

    DATASET: ClassVar[Any] = []
    ENVIRONMENT: ClassVar[Any] = "arithmetic"
    ROLLOUTS: ClassVar[type[RolloutConfig]] = RolloutConfig
    PLOTTED: ClassVar[Sequence[str]] = ("reward",)

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._source: RolloutSource | None = None
        self._rollout_ended: float | None = None  # perf_counter() when the last rollout was ready
        self._logged: list[dict[str, Any]] = []  # rl/log_completions' records not yet written
        self._rollout_producer: RolloutProducer[Made] | None = None  # rl/async_rollouts' worker
        self._rollout_sharding: TrainerSharding | None = None  # rl/rollout_devices' mesh

    @classmethod
    def config(cls) -> list[type]:
        """The trainer's keys and the rollouts' (``RolloutConfig.declarations``)."""
        return declarations.unique([*super().config(), *cls.ROLLOUTS.declarations(declared_environment(cls))])

    def resample_rounds(self) -> int:
        """Refill rounds of dynamic sampling at most per step (0: none)."""
        return 0

    def setup(self) -> None:
        if self._ready:
            return
        super().setup()
        if self.accumulate_steps > 1:
            raise ConfigError(
                f"{type(self).__qualname__} takes one update per batch of rollouts; leave training/micro_batch_size "
                "unset (gradient accumulation is not supported yet)"
            )
        self._rollout_sharding = self._own_rollout_mesh()
        if self._source is None:
            self._source = self._new_source()
        else:  # set up again (reconfigure): the same rollouts, decoded by the model as now configured
            self._source.model, self._source.sharding = self.model, self._rollout_sharding or self.sharding

    # -- devices --------------------------------------------------------------------------------
    def _rollout_device_count(self) -> int:
        """``rl/rollout_devices``: how many devices generate apart from the training mesh (0: none)."""
        count = int(self.setting(ROLLOUT_DEVICES, 0) or 0)
        devices = jax.devices()
        if count and jax.process_count() > 1:
            raise ConfigError(
                f"{ROLLOUT_DEVICES}={count} runs on one process only; leave it 0 to roll out on the training mesh"
            )
        if count >= len(devices):
            fix = f"give rollouts at most {len(devices) - 1}" if len(devices) > 1 else "leave it 0 on one device"
            raise ConfigError(f"{ROLLOUT_DEVICES}={count} leaves none of the {len(devices)} devices to train on; {fix}")
        return count

    def mesh_devices(self) -> list[Any]:
        """The devices the training mesh spans: all but the last ``rl/rollout_devices``."""
        devices = super().mesh_devices()
        count = self._rollout_device_count()
        return devices[: len(devices) - count] if count else devices

    def _own_rollout_mesh(self) -> TrainerSharding | None:
        """The data-parallel mesh of the last ``rl/rollout_devices`` devices, or None (rollouts on the
        training mesh)."""
        count = self._rollout_device_count()
        if not count:
            return None
        if self.args.batch_size % count:
            raise ConfigError(
                f"training/batch_size={self.args.batch_size} rows do not split over {ROLLOUT_DEVICES}={count}; "
                "make the batch a multiple of the rollout devices"
            )
        return build_sharding(self.model.sharding, layout="dp", devices=jax.devices()[-count:])

    def sampling_params(self, params: Any) -> Any:
        """``params`` where the rollouts are generated: the same arrays on the training mesh, else a copy
        on the rollout devices (every device holds them whole), sent as they are when this is called."""
        if self._rollout_sharding is None:
            return params
        return jax.device_put(params, self._rollout_sharding.replicated)

    def _new_source(self) -> RolloutSource:
        """The source of the run's keys: its environment, and the text of the policy's starting point."""
        with configuration(self.context.config):
            settings = configure(self.ROLLOUTS)
            environment: Environment = configure(declared_environment(type(self)))
        tokenizer_spec = self.init_source.tokenizer if self.init_source is not None else None
        text = policy_text(str(self.args.init_from or ""), self.context.root, tokenizer_spec, settings.chat)
        vocab = int(self.setting("architecture/vocab_size", 0) or 0)
        if vocab < text.tokenizer.vocab_size:
            named = "byte tokenizer's" if text.tokenizer.spec.get("kind") == "byte" else "tokenizer's"
            raise ConfigError(
                f"architecture/vocab_size={vocab} is smaller than the {named} {text.tokenizer.vocab_size}; "
                f"set architecture/vocab_size={text.tokenizer.vocab_size} or more"
            )
        return RolloutSource(
            settings,
            environment,
            text,
            self.model,
            self._rollout_sharding or self.sharding,
            self.sequence_length,
            completions=self.args.batch_size,
            seed=self.args.seed,
            config=self.context.config,
            resample_rounds=self.resample_rounds(),
        )

    @property
    def rollout_source(self) -> RolloutSource:
        """The source of this trainer's rollouts (set up first)."""
        self.setup()
        assert self._source is not None
        return self._source

    def prepare_to_run(self) -> None:
        """The rewards load what they need before the first rollout (``RolloutSource.prepare``)."""
        super().prepare_to_run()
        self.rollout_source.prepare()

    def tokenizer(self) -> Any:
        """The policy's tokenizer: the source's (``training/init_from``), else the byte tokenizer."""
        return self.rollout_source.text.tokenizer

    def chat_template(self) -> dict[str, str] | None:
        """The template prompts are rendered with (``rl/chat``), else the one of the source the policy starts
        from, kept in this run's folder whatever ``rl/chat`` is: ``generate/chat=true`` and ``hf/export`` use it."""
        rendered = self.rollout_source.chat_template()
        if rendered is not None:
            return rendered
        tokenizer_spec = self.init_source.tokenizer if self.init_source is not None else None
        template = found_template(str(self.args.init_from or ""), self.context.root, tokenizer_spec)
        return None if template is None else template_record(template)

    # -- rollouts -------------------------------------------------------------------------------
    def batch(self, slice: str = "train") -> Batch:
        """The rollouts of the current step: prompts of the environment, completions of the policy."""
        if slice != "train":
            raise ConfigError(f"{type(self).__qualname__} validates by generating; it has no {slice!r} batches")
        return self.rollouts(self.position("train"))

    def rollouts(self, step: int) -> dict[str, np.ndarray]:
        """Generate, score and arrange the completions of step ``step``; this process's rows. Every
        process generates and scores the whole batch (the decoder splits its rows over the mesh) and
        keeps its share, so a group's completions are seen together. With ``rl/async_rollouts`` they
        were made ahead on a worker thread (:class:`~theseus.model.rl.rollout_producer.RolloutProducer`)."""
        if self.state is None:
            self.state = self.init_state()
        elif not self.rollout_source.settings.async_rollouts:  # the previous update done: not the rollout's time
            jax.block_until_ready(self.state.params)
        began = time.perf_counter()
        update_seconds = began - self._rollout_ended if self._rollout_ended is not None else 0.0
        if self.rollout_source.settings.async_rollouts:
            produced = self._producer().take(step, self.state.params)
            made, staleness, waited = produced.made, produced.staleness, produced.waited
        else:
            made, staleness = self._made(self.sampling_params(self.state.params), step, sampled_apart=False), 0
            waited = made.seconds
        sampled, batch = made.sampled, made.batch
        self._keep_for_log(sampled, batch, step + 1)
        self._rollout_ended = time.perf_counter()
        generated = sum(sum(m) for m in sampled.rollouts.masks)
        rows = len(sampled.rollouts.rewards)

        def column(value: float) -> np.ndarray:
            return np.full(rows, value, np.float32)

        batch.update(
            rollout_seconds=column(made.seconds),
            rollout_tokens_per_s=column(generated / max(made.seconds, 1e-9)),
            rollout_wait_seconds=column(waited),
            update_seconds=column(update_seconds),
            rollout_share=column(waited / max(waited + update_seconds, 1e-9)),
            rollout_staleness=column(staleness),
            groups_dropped=column(sampled.dropped),
            reward_errors=column(sampled.reward_errors),
        )
        return packing.share(batch, self.sharding.feed_index, self.sharding.feed_count)  # this process's rows

    def _made(self, params: Any, step: int, *, sampled_apart: bool) -> Made:
        """Step ``step``'s rollouts by ``params``, arranged as rows, timed; ``sampled_apart``: made ahead of
        the update that learns from them, so the rows carry what the sampling parameters gave
        (:meth:`sampler_rows`)."""
        began = time.perf_counter()
        sampled = self.rollout_source.sample(params, step)
        batch = self.rollout_rows(sampled, step)
        if sampled_apart:
            batch.update(self.sampler_rows(params, batch))
        return Made(sampled, batch, time.perf_counter() - began)

    def sampler_rows(self, params: Any, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Rows that rollouts made ahead (``rl/async_rollouts``) carry from the parameters that sampled them;
        a subclass whose objective corrects for stale samples adds them (GRPO: the sampler's log-probabilities)."""
        return {}

    def _producer(self) -> RolloutProducer[Made]:
        """The worker that makes rollouts ahead (``rl/async_rollouts``), started on first use."""
        if self._rollout_producer is None:
            staleness = self.rollout_source.settings.max_staleness

            def make(params: Any, step: int) -> Made:
                return self._made(params, step, sampled_apart=staleness > 0)

            copy = None if self._rollout_sharding is None else self.sampling_params  # a transfer copies
            self._rollout_producer = RolloutProducer(make, staleness, copy, last=int(self.args.steps) - 1)
        return self._rollout_producer

    def close(self) -> None:
        """Stop the rollout worker (rollouts made ahead are dropped), then what the trainer closes."""
        if self._rollout_producer is not None:
            self._rollout_producer.close()
            self._rollout_producer = None
        super().close()

    def _keep_for_log(self, sampled: Sampled, batch: dict[str, np.ndarray], update: int) -> None:
        """Keep the first ``rl/log_completions`` rollouts of ``update`` as records (``RolloutLog`` writes them)."""
        settings = self.rollout_source.settings
        if settings.log_completions:
            advantages = batch.get("advantages")
            done = sampled.rollouts
            self._logged += rollout_records(done, update, settings.log_completions, settings.group_size, advantages)

    def logged_rollouts(self) -> list[dict[str, Any]]:
        """The rollout records kept since the last call (``rl/log_completions``), handed over once."""
        records, self._logged = self._logged, []
        return records

    def callbacks(self) -> list[Any]:
        """The job's callbacks and, with ``rl/log_completions``, the one that writes the rollouts kept."""
        added = super().callbacks()
        if self.rollout_source.settings.log_completions:
            added.append(RolloutLog(self.logged_rollouts))
        return added

    def rollout_rows(self, sampled: Sampled, step: int) -> dict[str, np.ndarray]:
        """The batch rows of a step's rollouts (``RolloutSource.rows``); a subclass adds what its
        objective reads."""
        return self.rollout_source.rows(sampled.rollouts)

    def abstract_train_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        batch = super().abstract_train_batch()
        rows = (self.accumulate_steps, self.micro_rows)
        per_row = self.sharding.batch_sharding(len(rows), leading=1)
        shape = (*rows, self.sequence_length)
        batch["padding_mask"] = jax.ShapeDtypeStruct(shape, jnp.bool_, sharding=batch["x"].sharding)
        batch["completion_mask"] = jax.ShapeDtypeStruct(shape, jnp.bool_, sharding=batch["x"].sharding)
        for name in [*LOGGED, *self.rollout_source.scored_columns()]:
            batch[name] = jax.ShapeDtypeStruct(rows, jnp.float32, sharding=per_row)
        return batch

    def eval_rollouts(self, state: TrainState, batches: int, count: int) -> Rollouts:
        """``batches`` x ``count`` prompts of the environment's ``eval`` split completed by ``state``'s
        parameters, greedily or at ``rl/eval_temperature``, and scored."""
        self.state = state
        return self.rollout_source.evaluate(self.sampling_params(state.params), batches, count)


__all__ = ["RolloutTrainer"]
