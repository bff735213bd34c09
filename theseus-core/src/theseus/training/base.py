"""``BaseTrainer``: declarations, the override contract, and the helpers the loop is built from.

A trainer declares what it uses (``CONFIG``, ``MODEL``, ``DATASET``, ``OPTIMIZER``,
``SCHEDULE``, ``OBJECTIVE``, ``EVALUATION``, ``ANALYSIS``) and may override the smallest piece of the
computation: ``batch``, ``forward``, ``train_step``, ``val_step`` or ``trace``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from theseus.base.axis import Pipelining
from theseus.base.job import Job, JobContext
from theseus.base.numerics import computing_in
from theseus.config import Schema, configuration, configure, parse_overrides, read_yaml
from theseus.config.configuration import flat_values
from theseus.config.paths import absolute, resolve_absolute
from theseus.errors import ConfigError, DataError
from theseus.plugins.gather import gather_classes
from theseus.runs.directory import default_run_name
from theseus.runs.layout import check_run_name
from theseus.tracking.config import TrackingConfig
from theseus.training import (
    adapters,
    assembly,
    datacheck,
    declarations,
    frozen,
    init_from,
    keys,
    memory,
    optimizer_state,
    selection,
    step_calls,
    steps,
)
from theseus.training import capture as activation_capture
from theseus.training import objective as objectives
from theseus.training.config import BaseTrainerConfig
from theseus.training.loop import TrainingLoop
from theseus.training.optimizers import AdamW, Optimizer
from theseus.training.protocol import Batch
from theseus.training.schedules import Schedule
from theseus.training.sharding import TrainerSharding, build_sharding
from theseus.training.state import TrainState, abstract_variables, create_state, state_shardings, with_shardings


class BaseTrainer(Job):
    """A training job. Subclass it and replace only the declarations you need.

    ``self.args`` is the hydrated ``CONFIG``; ``run()`` trains with a progress bar,
    validates, evaluates, analyses and checkpoints under ``<root>/runs/<run name>``, and
    resumes from the latest checkpoint when run again.
    """

    CONFIG: ClassVar[type] = BaseTrainerConfig
    MODEL: ClassVar[Any] = None
    DATASET: ClassVar[Any] = []
    OPTIMIZER: ClassVar[Any] = AdamW
    SCHEDULE: ClassVar[Any] = None
    EVALUATION: ClassVar[Sequence[Any]] = []
    ANALYSIS: ClassVar[Sequence[Any]] = []
    #: Loop callbacks (``theseus.training.callbacks``): instances, or classes built from the configuration.
    CALLBACKS: ClassVar[Sequence[Any]] = []
    #: What the trainer optimises (``theseus.training.objective``): an ``Objective`` class, instance or
    #: registered name, which ``objective=`` replaces; None where ``objective()`` builds it from the
    #: trainer's own keys (and no other may be selected).
    OBJECTIVE: ClassVar[Any] = objectives.CrossEntropy
    #: Parameters every update leaves out (``theseus.training.steps.HeldOut``): by default a quantized
    #: base's frozen kernels (``theseus.training.frozen``); None differentiates every parameter.
    HELD_OUT: ClassVar[Any] = frozen.FROZEN_KERNELS
    #: Names a run may select per kind, e.g. ``{"model": ["gpt", "llama"]}`` (absent kind: any).
    ACCEPTS: ClassVar[Mapping[str, Sequence[str]]] = {}
    #: Logged metrics drawn beside ``loss.png``, each as ``<run>/<metric>.png`` (train and val curves).
    PLOTTED: ClassVar[Sequence[str]] = ()

    args: Any

    def __init__(self, context: JobContext) -> None:
        with configuration(context.config):
            super().__init__(context)
        self.step = 0
        self._positions: dict[str, int] = {"train": 0, "val": 0}
        self._ready = False
        self._compiled: dict[str, Any] = {}
        self.model: Any = None
        self._objective: objectives.Objective | None = None
        self.sharding: TrainerSharding = None  # type: ignore[assignment]
        self.flywheel: Any = None
        self.tx: optax.GradientTransformation | None = None
        self.lr_schedule: Any = None
        self.evaluations: list[Any] = []
        self.analyses: list[Any] = []
        #: The train state after ``run()`` (None before).
        self.state: TrainState | None = None
        self.init_source: Any = None  # training/init_from, opened by setup()
        self.trains_adapters = False  # the model holds adapters (LoRA): they alone train, set by setup()
        #: What ``model/remat=auto`` chose (``theseus.training.memory.Choice``), once ``fit_memory()`` ran.
        self.memory_choice: Any = None
        if getattr(self.args, "run_name", ""):  # a bad name fails before anything is prepared or written
            check_run_name(self.args.run_name)

    # -- declarations ----------------------------------------------------------------------
    @classmethod
    def config(cls) -> list[type]:
        """Every configuration class of this job: CONFIG, ``MODEL.gather()``, what DATASET,
        OPTIMIZER, SCHEDULE, OBJECTIVE, EVALUATION, ANALYSIS and CALLBACKS declare, and plugin
        contributions (``theseus_gather`` hook with ``owner`` = this trainer class)."""
        contributed: list[type] = [cls.CONFIG] if cls.CONFIG is not None else []
        contributed += [TrackingConfig, datacheck.DataCheckConfig]
        if cls.MODEL is not None:
            contributed += declarations.contributed_classes(declarations.resolve("model", cls.MODEL))
        contributed += declarations.dataset_classes(cls.DATASET)
        contributed += declarations.contributed_classes(cls.optimizer())
        contributed += declarations.contributed_classes(cls.schedule())
        declared_objective = cls.declared_objective()
        if declared_objective is not None and declared_objective.selectable:
            contributed += [selection.ObjectiveSelection]
            contributed += declarations.contributed_classes(declared_objective)
        for kind, entries in (("evaluation", cls.EVALUATION), ("analysis", cls.ANALYSIS)):
            for entry in declarations.as_list(entries):
                contributed += declarations.contributed_classes(declarations.resolve(kind, entry))
        for callback in declarations.as_list(cls.CALLBACKS):
            contributed += declarations.contributed_classes(callback)
        contributed = declarations.unique(contributed)
        children = {cls: contributed}
        gathered = gather_classes(cls, lambda klass: children.get(klass, []))
        return [klass for klass in gathered if klass is not cls]

    @classmethod
    def schema(cls) -> Schema:
        """The selection keys (``select/model``, ... defaulting to the declarations) and ``config()``."""
        return selection.schema_of(cls)

    @classmethod
    def selected(
        cls, file_values: Mapping[str, Any], overrides: Mapping[str, Any], root: Path | None = None
    ) -> tuple[type[BaseTrainer], dict[str, Any], dict[str, Any]]:
        """This trainer with the components a run selects by name (``optimizer=lion``) declared; with
        no ``model=``, a run from ``training/init_from`` trains the model its source holds (runs under
        ``root``)."""
        return selection.select(cls, file_values, overrides, root)

    @classmethod
    def optimizer(cls) -> Optimizer:
        """The declared ``Optimizer`` (AdamW when OPTIMIZER is None)."""
        return declarations.resolve("optimizer", cls.OPTIMIZER) if cls.OPTIMIZER is not None else AdamW

    @classmethod
    def schedule(cls) -> Schedule | None:
        return declarations.resolve("schedule", cls.SCHEDULE) if cls.SCHEDULE is not None else None

    @classmethod
    def create(
        cls,
        root: str | Path,
        overrides: Mapping[str, Any] | Sequence[str] = (),
        *,
        config_file: str | Path | None = None,
        name: str | None = None,
    ) -> BaseTrainer:
        """Build the trainer outside the CLI: resolve its configuration like ``theseus run`` does."""
        file_values = read_yaml(config_file) if config_file is not None else {}
        given = flat_values(overrides, "overrides") if isinstance(overrides, Mapping) else parse_overrides(overrides)
        chosen, file_values, given = cls.selected(file_values, given, absolute(root))
        cfg = resolve_absolute(chosen.schema(), file_values, given)  # as the CLI does
        own_key = cls.__dict__.get("JOB_KEY")
        context = JobContext(name=name or own_key or cls.__name__, root=absolute(root), config=cfg)
        return chosen(context)  # type: ignore[return-value]

    # -- the override contract -------------------------------------------------------------
    def batch(self, slice: str = "train") -> Batch:
        """Host-side batch of ``slice`` at the current position: numpy ``x``, ``y``, ``padding_mask``.

        The result may be cached: copy it before changing it.
        """
        if self.flywheel is None and declarations.as_list(self.DATASET):
            self._open_flywheel()
        if self.flywheel is None:
            raise DataError(
                f"{type(self).__qualname__} declares DATASET = []; "
                "override batch(slice) to return x, y and padding_mask"
            )
        return self.flywheel.batch(self.position(slice), slice)

    @staticmethod
    def forward(
        state: TrainState,
        params: Any,
        batch: Batch,
        key: jax.Array | None = None,
        deterministic: bool = False,
        intermediates: bool = False,
    ) -> tuple[jax.Array, jax.Array | None, dict[str, Any]]:
        """Apply the model; returns ``(logits, loss, metadata)``.

        With ``intermediates=True`` every module's output is returned as
        ``metadata["intermediates"]``.
        """
        return steps.forward(state, params, batch, key=key, deterministic=deterministic, intermediates=intermediates)

    @classmethod
    def train_step(
        cls,
        state: TrainState,
        batch: Batch,
        key: jax.Array,
        accumulate_steps: int,
        *,
        sharding: TrainerSharding,
        objective: objectives.Objective | None = None,
        skip_nonfinite: bool = False,
    ) -> tuple[TrainState, jax.Array, dict[str, Any], jax.Array]:
        """One update of ``objective`` (the trainer's :meth:`objective`: :meth:`train_step_fn` passes it) from
        ``batch`` arranged ``[accumulate_steps, micro_batch, ...]``; without one, a TypeError.

        Returns ``(state, loss, metadata, grad_norm)``; ``grad_norm`` is measured before clipping.
        """
        return steps.train_step(
            cls,
            state,
            batch,
            key,
            accumulate_steps,
            objective=objective if objective is not None else step_calls.lent_objective("train_step"),
            sharding=sharding,
            skip_nonfinite=skip_nonfinite,
            held_out=cls.HELD_OUT,
        )

    @classmethod
    def declared_objective(cls) -> type[objectives.Objective] | None:
        """The objective class ``OBJECTIVE`` declares (a registered name resolved), or None."""
        if cls.OBJECTIVE is None:
            return None
        declared = declarations.resolve("objective", cls.OBJECTIVE)
        if not (isinstance(declared, type) and issubclass(declared, objectives.Objective)):
            raise ConfigError(
                f"{cls.__qualname__}.OBJECTIVE is {declared!r}, not a theseus Objective class; declare a subclass "
                "of theseus.training.objective.Objective or its registered name"
            )
        return declared

    def objective(self) -> objectives.Objective:
        """What this trainer optimises, built once: ``OBJECTIVE`` (``objective=`` selects another registered
        one where the declared objective is selectable), from the run's keys and this trainer
        (:meth:`~theseus.training.objective.Objective.for_trainer`)."""
        if self._objective is None:
            declared = self.declared_objective()
            if declared is None:
                raise ConfigError(
                    f"{type(self).__qualname__} declares OBJECTIVE = None; declare the objective class it optimises"
                )
            with configuration(self.context.config):
                built = declared.for_trainer(self)
            if not isinstance(built, objectives.Objective):
                raise ConfigError(f"{type(self).__qualname__}.OBJECTIVE built {built!r}, not a theseus Objective")
            self._objective = built
        return self._objective

    def updates_per_step(self) -> int:
        """Optimizer updates one ``train_step`` takes (several on the same batch, as reinforcement learning
        does with its rollouts): the objective's ``updates``. The schedule gives each of them the learning
        rate of its step."""
        return int(self.objective().updates)

    @classmethod
    def val_step(
        cls,
        state: TrainState,
        batch: Batch,
        *,
        sharding: TrainerSharding,
        objective: objectives.Objective | None = None,
    ) -> tuple[Any, Any, dict[str, Any]]:
        """``(loss_sum, count, metadata)`` of one batch without dropout under ``objective`` (the trainer's:
        :meth:`val_step_fn` passes it; without one, a TypeError): the targets' summed cross-entropy and their
        count whatever the objective, its own loss in the metadata (:func:`theseus.training.steps.val_step`)."""
        if objective is None:
            objective = step_calls.lent_objective("val_step")
        return steps.val_step(cls, state, batch, objective=objective, sharding=sharding)

    @classmethod
    def trace(cls, state: TrainState, batch: Batch, key: jax.Array, *, sharding: TrainerSharding) -> Any:
        """The pure model call used by debugging and analysis (uses only its arguments)."""
        return steps.trace(cls, state, batch, key, sharding=sharding)

    # -- setup -------------------------------------------------------------------------------
    def setting(self, key: str, default: Any = None) -> Any:
        """A value of the job's configuration by key (e.g. ``"architecture/block_size"``)."""
        return self.context.config.get(key, default)

    @property
    def run_name(self) -> str:
        return self.args.run_name or default_run_name(self.context.name, type(self))

    def model_class(self) -> type:
        """The model class the trainer builds: ``MODEL`` resolved (a trainer that extends the selected
        model, e.g. with a reward head, returns its subclass here)."""
        found: type = declarations.resolve("model", self.MODEL)
        return found

    def setup(self) -> None:
        """Build the model, mesh, data, optimizer and the abstract state (idempotent); the pieces are
        built by ``theseus.training.assembly``."""
        if self._ready:
            return
        if self.MODEL is None:
            raise ConfigError(f"{type(self).__qualname__} declares no MODEL; set MODEL to a model class")
        if getattr(self.args, "init_from", ""):  # the source's architecture keys enter the configuration first
            model_cls = self.model_class()
            self.init_source, self.context.config = init_from.prepare(
                self.args.init_from, self.context.root, model_cls, self.context.config, self.schema()
            )
        with configuration(self.context.config):
            args = self.args
            self.model = configure(self.model_class())
            block_size = self.setting("architecture/block_size")
            self.sequence_length = assembly.sequence_length(args.sequence_length, block_size)
            self.sharding = build_sharding(
                self.model.sharding,
                layout=args.layout,
                data=args.mesh_data,
                model=args.mesh_model,
                expert=args.mesh_expert,
                context=args.mesh_context,
                context_attention=args.context_attention,
                pipeline=args.mesh_pipeline,
                pipeline_plan=Pipelining(args.pipeline_schedule, args.pipeline_microbatches, args.pipeline_virtual),
                devices=self.mesh_devices(),
            )
            self.accumulate_steps, self.micro_rows = assembly.batch_geometry(
                args.batch_size, args.micro_batch_size, self.sharding
            )
            self.flywheel = self._build_flywheel()
            self.lr_schedule = assembly.learning_rate_schedule(self.schedule(), args.lr, args.steps)
            self.init_key, self.dropout_key = keys.root_keys(args.seed)  # computed on the host: nothing to compile
            variables = abstract_variables(self.model, self.sharding, self.init_key, self.sequence_length)
            per_update = assembly.per_step(self.lr_schedule, self.updates_per_step())
            tx = assembly.optimizer_chain(
                self.optimizer(),
                per_update,
                args.grad_clip,
                variables,
                state_dtype=args.optimizer_state_dtype,
                offload=args.optimizer_offload,
            )
            params = nn.unbox(variables)["params"]
            self.trains_adapters = adapters.has_adapters(params)
            self.tx = self._restrict_optimizer(tx, params)
            self.evaluations = [_instantiate(declarations.resolve("evaluation", e)) for e in self.EVALUATION]
            self.analyses = [_instantiate(declarations.resolve("analysis", a)) for a in self.ANALYSIS]
            self.abstract_state, self.state_shardings = state_shardings(
                self.model,
                self.tx,
                self.sharding,
                self.init_key,
                self.sequence_length,
                variables,
                offload=args.optimizer_offload,
                keep_bytes=int(max(args.optimizer_offload_keep_gb, 0.0) * 1e9),
            )
            if self.init_source is not None:
                init_from.check_data(self.flywheel, self.init_source)
            if args.compilation_cache:  # only once the job is known to be runnable: nothing written before
                from theseus.training.compilation import enable_compilation_cache

                enable_compilation_cache(self.context.root / "cache" / "jax")
        self._ready = True

    def prepare_to_run(self) -> None:
        """Load what only a run needs, once, after ``setup``: the training loop calls it before it writes
        anything; ``theseus plan``, which sets trainers up to compile their steps, does not."""

    def reconfigure(self, values: Mapping[str, Any]) -> None:
        """Set the trainer up again with some configuration values changed (a ``model/remat`` policy, a
        micro batch): ``args``, the model, the batch geometry, the data and the abstract state follow them,
        and the compiled functions are dropped."""
        self.close()
        self.context.config = self.context.config.with_values(values)
        with configuration(self.context.config):
            self.args = configure(self.CONFIG)
        self._compiled.clear()
        self._ready = False
        self.setup()

    def fit_memory(self) -> Any:
        """With ``model/remat=auto``: configure the fastest remat policy and micro batch whose compiled step
        fits the device, and return the choice (``theseus.training.memory``); the configuration then holds
        the chosen values and the compiled step is kept for the run. None without ``auto``."""
        self.setup()
        if self.memory_choice is None and memory.requested(self.context.config):
            self.memory_choice = memory.fit(self)
        return self.memory_choice

    def _restrict_optimizer(self, tx: optax.GradientTransformation, params: Any) -> optax.GradientTransformation:
        """The optimizer the run trains with, given the full one and the abstract parameters; a
        subclass that trains part of the parameters narrows it here, before the optimizer state is
        laid out. What ``HELD_OUT`` splits off (a quantized base's frozen kernels) is out of its sight;
        a model with adapters (LoRA) trains them alone; ``model/lora/rank`` above 0 with no adapter in
        the model is refused, and so is a quantized base without adapters or integer parameters that
        ``HELD_OUT`` does not hold out (neither can be trained)."""
        held, rest = self.HELD_OUT.split(params) if self.HELD_OUT is not None else ({}, params)
        name = type(self).__name__
        integers = frozen.integer_paths(rest)
        if integers:
            raise ConfigError(
                f"{name} cannot train integer parameters ({integers[0]}: a quantized base its HELD_OUT does "
                "not hold out); leave HELD_OUT at BaseTrainer's default, or set model/quantize=none"
            )
        if not adapters.has_adapters(rest):
            rank = int(self.setting("model/lora/rank", 0) or 0)
            if rank > 0:
                raise ConfigError(
                    f"model/lora/rank={rank}, but no layer of {type(self.model).__name__} took adapters "
                    "(model/lora/targets match none of its projections); choose targets it has, or set "
                    "model/lora/rank=0 to train every parameter"
                )
            if held:
                raise ConfigError(
                    f"{name} cannot train every parameter of a quantized base (model/quantize keeps its "
                    "kernels frozen); set model/lora/rank>0 to train adapters over it, or model/quantize=none"
                )
            return tx
        restricted = adapters.adapters_only(tx, rest)
        return frozen.excluding(self.HELD_OUT, restricted) if held else restricted

    def mesh_devices(self) -> list[Any]:
        """The devices the mesh spans: all devices of all processes (override to use fewer)."""
        return list(jax.devices())

    def _open_flywheel(self) -> Any:
        """The data loader, opened again if ``close()`` released it."""
        self.setup()
        if self.flywheel is None:
            with configuration(self.context.config):
                self.flywheel = self._build_flywheel()
        return self.flywheel

    def _build_flywheel(self) -> Any:
        if not declarations.as_list(self.DATASET):
            return None
        return assembly.open_flywheel(
            self.DATASET,
            root=self.context.root,
            sequence_length=self.sequence_length,
            batch_size=self.args.batch_size,
            seed=self.args.seed,
            sharding=self.sharding,
            accumulate_steps=self.accumulate_steps,
            vocab_size=self.setting("architecture/vocab_size"),
            block_size=self.setting("architecture/block_size"),
        )

    @property
    def batch_rows(self) -> int:
        """Rows of one optimizer step that this process feeds."""
        return self.args.batch_size // self.sharding.feed_count

    @property
    def eval_rows(self) -> int:
        """Rows per forward pass of evaluations (the global micro batch)."""
        return self.micro_rows

    @property
    def tokens_per_step(self) -> int:
        return self.args.batch_size * self.sequence_length

    def learning_rate(self, step: int) -> float:
        """The learning rate of the update at ``step`` (0-based)."""
        return float(self.lr_schedule(step))

    def dataset_names(self) -> list[str]:
        """The prepared-folder names (``<root>/data/<name>``) DATASET samples from, in declaration order."""
        from theseus.training.flywheel.strategy import strategy_of

        if not declarations.as_list(self.DATASET):
            return []
        return [sampling.name for sampling in strategy_of(self.DATASET)]

    def tokenizer(self) -> Any:
        """The tokenizer of the training data (a byte tokenizer for custom batches)."""
        if declarations.as_list(self.DATASET):
            return self._open_flywheel().tokenizer()
        from theseus.data.tokenizers.byte import ByteTokenizer

        return ByteTokenizer()

    # -- data ------------------------------------------------------------------------------
    def position(self, slice: str = "train") -> int:
        """The data position ``batch(slice)`` reads: the step for ``train``, the batch index otherwise."""
        return self._positions.get(slice, 0)

    def host_batch(self, slice: str = "train", position: int | None = None) -> dict[str, np.ndarray]:
        """``batch(slice)`` at ``position``, checked for the shapes the step expects."""
        self.setup()
        if position is not None:
            self._positions[slice] = int(position)
        batch = self.batch(slice)
        if not isinstance(batch, Mapping) or "x" not in batch or "y" not in batch:
            raise DataError(f"{type(self).__qualname__}.batch({slice!r}) must return a mapping with 'x' and 'y'")
        expected = (self.batch_rows, self.sequence_length)
        for name in ("x", "y", "padding_mask"):
            if name in batch and tuple(np.shape(batch[name])) != expected:
                shape = tuple(np.shape(batch[name]))
                raise DataError(
                    f"{type(self).__qualname__}.batch({slice!r}) returned {name} of shape {shape}; "
                    f"expected {expected} (training/batch_size rows of training/sequence_length tokens)"
                )
        return {name: np.asarray(value) for name, value in batch.items()}

    def device_train_batch(self, host: Batch) -> dict[str, jax.Array]:
        """Arrange a host batch as ``[accumulate_steps, micro_batch, ...]`` on the mesh."""
        k = self.accumulate_steps
        arranged = {name: np.asarray(v).reshape((k, -1, *np.shape(v)[1:])) for name, v in host.items()}
        return self.sharding.put_batch(arranged, leading=1)

    def abstract_train_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        """What :meth:`device_train_batch` returns, as shapes, dtypes and shardings: the step's inputs
        for compiling it without data (``theseus plan``). A trainer whose batches hold more keys adds them."""
        self.setup()
        shape = (self.accumulate_steps, self.micro_rows, self.sequence_length)
        sharding = self.sharding.batch_sharding(len(shape), leading=1)
        packed = self.flywheel is not None and self.flywheel.packed
        mask = jnp.int32 if packed else jnp.bool_
        dtypes = {"x": jnp.int32, "y": jnp.int32, "padding_mask": mask}
        return {name: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for name, dtype in dtypes.items()}

    def device_eval_batch(self, host: Batch) -> dict[str, jax.Array]:
        """Place a host batch of validation rows on the mesh (what ``val_step`` receives)."""
        return self.sharding.put_batch(host)

    def step_key(self, step: int) -> jax.Array:
        """The dropout key of update ``step``: a pure function of (seed, step), replicated over the mesh as
        the step is compiled ahead of time (``theseus plan``, ``model/remat=auto``), so the run calls that
        very program."""
        key = keys.step_key(self.dropout_key, step)
        if not _typed_keys(key):
            return self.sharding.put_replicated(np.asarray(key))
        placed = self.sharding.put_replicated(np.asarray(jax.random.key_data(key)))
        return jax.random.wrap_key_data(placed, impl=jax.random.key_impl(key))

    # -- state -----------------------------------------------------------------------------
    def init_state(self) -> TrainState:
        """Fresh parameters and optimizer state, created directly with their shardings (the parameters
        of ``training/init_from`` when set)."""
        self.setup()
        if self.init_source is not None:
            return init_from.initial_state(self, self.init_source)
        with configuration(self.context.config):
            return create_state(
                self.model, self.tx, self.sharding, self.init_key, self.sequence_length, self.state_shardings
            )

    def load_base(self, source: Any, abstract: Any, shardings: Any) -> Any:
        """The parameters ``abstract`` names (every one but the adapters) from the ``training/init_from``
        source, placed on ``shardings``, in the model's layout (a quantized base is quantized as it is
        read: :meth:`~theseus.training.init_from.InitSource.load`); a trainer whose parameters hold
        more than the source's (a fresh head) adds them here."""
        return source.load(self.model, abstract, shardings)

    @property
    def adapter_checkpoints(self) -> bool:
        """Checkpoints hold only the adapters: LoRA over the base that ``training/init_from`` names
        (read again on resume, by ``generate`` and by the exports)."""
        return self.trains_adapters and bool(getattr(self.args, "init_from", ""))

    def checkpoint_tree(self, state: TrainState) -> dict[str, Any]:
        return {
            "params": adapters.prune(state.params) if self.adapter_checkpoints else state.params,
            "opt_state": state.opt_state,
            "step": state.step,
            "rng": self.sharding.put_replicated(np.asarray(jax.random.key_data(self.dropout_key))),
        }

    def abstract_checkpoint_tree(self) -> dict[str, Any]:
        a, s = self.abstract_state, self.state_shardings
        rng = jax.random.key_data(self.dropout_key)
        params = with_shardings(a.params, s.params)
        return {
            "params": adapters.prune(params) if self.adapter_checkpoints else params,
            "opt_state": with_shardings(a.opt_state, s.opt_state),
            "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=s.step),
            "rng": jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=self.sharding.replicated),
        }

    def state_from_checkpoint(self, tree: Mapping[str, Any]) -> TrainState:
        params = tree["params"]
        if self.adapter_checkpoints:  # the saved adapters over the base read again from its source
            params = adapters.overlay(self.init_state().params, params)
        rng = jnp.asarray(np.asarray(tree["rng"].addressable_data(0)))  # replicated: every process has it all
        self.dropout_key = jax.random.wrap_key_data(rng) if _typed_keys(self.dropout_key) else rng
        return self.abstract_state.replace(params=params, opt_state=tree["opt_state"], step=tree["step"])

    # -- compiled functions ----------------------------------------------------------------
    def compiled(self, name: str, build: Any) -> Any:
        """A function built once per trainer by ``build()`` (e.g. a ``jax.jit``), cached under ``name``."""
        if name not in self._compiled:
            self._compiled[name] = build()
        return self._compiled[name]

    def train_step_fn(self) -> Any:
        """``fn(state, device_batch, key) -> (state, loss, meta, grad_norm, lr)``, jitted, state donated."""
        self.setup()
        cls, sharding, shardings, objective = type(self), self.sharding, self.state_shardings, self.objective()
        options: dict[str, Any] = {"sharding": sharding}
        if self.args.skip_nonfinite:
            options["skip_nonfinite"] = True
        k = self.accumulate_steps
        schedule = self.lr_schedule

        precision = self.args.precision

        def step(state: TrainState, batch: Batch, key: jax.Array, arrays: dict[str, Any]) -> Any:
            lr = schedule(state.step)
            with computing_in(precision):
                new_state, loss, meta, grad_norm = step_calls.call_step(
                    cls.train_step, state, batch, key, k, objective=objective.with_arrays(arrays), **options
                )
            new_state = jax.lax.with_sharding_constraint(new_state, shardings)
            return new_state, loss, meta, grad_norm, lr

        return self.compiled("train", lambda: self._with_arrays(jax.jit(step, donate_argnums=self._donated())))

    def _donated(self) -> tuple[int, ...]:
        """The train step's donated arguments: the state, unless it holds an offloaded optimizer state that
        the platform cannot alias (:func:`~theseus.training.optimizer_state.donates_offloaded_state`)."""
        platform = self.sharding.accelerator.platform
        if self.args.optimizer_offload and not optimizer_state.donates_offloaded_state(platform):
            return ()
        return (0,)

    def val_step_fn(self) -> Any:
        """``fn(state, device_batch) -> (loss_sum, count, meta)``, jitted, in the train step's precision."""
        self.setup()
        cls, sharding, precision, objective = type(self), self.sharding, self.args.precision, self.objective()

        def val_step(state: TrainState, batch: Batch, arrays: dict[str, Any]) -> Any:
            with computing_in(precision):
                bound = objective.with_arrays(arrays)
                return step_calls.call_step(cls.val_step, state, batch, objective=bound, sharding=sharding)

        return self.compiled("val", lambda: self._with_arrays(jax.jit(val_step)))

    def objective_arrays(self) -> dict[str, Any]:
        """The arrays of the objective that the jitted steps take with every call (its array fields, see
        :meth:`~theseus.training.objective.Objective.arrays`: a teacher's parameters). A trainer that keeps
        them itself (the distillation trainers) overrides this and :meth:`abstract_objective_arrays`."""
        return self.objective().arrays()

    def abstract_objective_arrays(self) -> dict[str, Any]:
        """The shapes, dtypes and shardings of :meth:`objective_arrays`, for compiling a step without them."""
        return jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=getattr(a, "sharding", None)),
            self.objective_arrays(),
        )

    def _with_arrays(self, jitted: Any) -> step_calls.WithObjectiveArrays:
        """``jitted`` given the objective's arrays with every call: read again each time from
        :meth:`objective_arrays` where there are any, else none (the objective is not built again)."""
        if not jax.tree.leaves(self.abstract_objective_arrays()):  # abstract: nothing is read to ask
            return step_calls.WithObjectiveArrays(jitted, dict, dict)
        return step_calls.WithObjectiveArrays(jitted, self.objective_arrays, self.abstract_objective_arrays)

    def trace_fn(self) -> Any:
        """``fn(state, device_batch, key)``: the trainer's ``trace`` under jit."""
        self.setup()
        cls, sharding = type(self), self.sharding
        return self.compiled("trace", lambda: jax.jit(functools.partial(cls.trace, sharding=sharding)))

    def capture(self, state: TrainState, batch: Batch, key: jax.Array) -> tuple[Any, list[tuple[tuple[str, ...], Any]]]:
        """Run ``trace`` with every module's output recorded (see ``theseus.training.capture``).

        Returns ``(trace outputs, [(path, array), ...])`` with the module outputs in execution
        order; a path is the module path plus the output's position, e.g. ``("up", "__call__", "0")``.
        """
        return activation_capture.capture(self, state, batch, key)

    # -- validation ------------------------------------------------------------------------
    def validate(self, state: TrainState, batches: int | None = None, slice: str = "val") -> dict[str, Any]:
        """The mean cross-entropy per target (``loss``) over ``batches`` batches of ``slice`` and the targets
        counted (``targets``), the objective's own loss under its name (``Objective.metric``) where it is
        another, and the averaged metadata."""
        from theseus.training.metrics import scalars

        batches = self.args.eval_batches if batches is None else batches
        fn = self.val_step_fn()
        sums: list[Any] = []
        for index in range(batches):
            host = self.host_batch(slice, position=index)
            sums.append(fn(state, self.device_eval_batch(host)))
        fetched = jax.device_get(sums)
        loss_sum = sum(float(np.asarray(s[0])) for s in fetched)
        count = sum(float(np.asarray(s[1])) for s in fetched)
        metas = [scalars(s[2]) for s in fetched]
        totals = {
            name: sum(m.pop(name, 0.0) for m in metas) for name in (steps.OBJECTIVE_LOSS_SUM, steps.OBJECTIVE_WEIGHT)
        }
        result: dict[str, Any] = {}
        for name in metas[0] if metas else {}:
            values = [m[name] for m in metas if name in m]
            result[name] = float(np.mean(values))
        result["loss"] = loss_sum / count if count else float("nan")
        result["targets"] = int(count)
        if weight := totals[steps.OBJECTIVE_WEIGHT]:
            objective = self.objective()
            result[objective.metric] = totals[steps.OBJECTIVE_LOSS_SUM] / weight
            if objective.weight_name:
                result[objective.weight_name] = int(weight)
        return result

    # -- running ---------------------------------------------------------------------------
    def close(self) -> None:
        """Release the data loader (it is opened again when a batch is next needed)."""
        if self.flywheel is not None:
            self.flywheel.close()
            self.flywheel = None

    def callbacks(self) -> list[Any]:
        """The loop callbacks this job adds (``theseus.training.callbacks``), built for each run:
        ``CALLBACKS``, classes among them configured from the job's keys. Override it to add
        callbacks that depend on ``self.args``."""
        with configuration(self.context.config):
            return [_instantiate(entry) for entry in declarations.as_list(self.CALLBACKS)]

    def run(self) -> None:
        """Train (or resume) this job's run; see ``theseus.training.loop``."""
        TrainingLoop(self).run()


def _instantiate(klass: Any) -> Any:
    if not isinstance(klass, type):
        return klass
    return configure(klass) if dataclasses.is_dataclass(klass) else klass()


def _typed_keys(key: jax.Array) -> bool:
    return bool(jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key))


__all__ = ["BaseTrainer", "BaseTrainerConfig", "Batch", "TrainState", "TrainerSharding"]
