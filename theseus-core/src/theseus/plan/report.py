"""``theseus plan``: compile a job's training step for a target and say whether it fits and how fast it
might run. :func:`make_plan` does the work; :func:`render` and :func:`as_dict` present it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from theseus.errors import ConfigError
from theseus.plan.build import CompiledStep, StepTooLarge, build_trainer, compile_train_step
from theseus.plan.estimate import DEFAULT_OVERLAP, Estimate, estimate
from theseus.plan.hlo import ProgramCost, analyse
from theseus.plan.targets import Target, parse_target
from theseus.training.collector import rare_collections

GB = 1e9


@dataclass
class Plan:
    """One compiled training step on one target: memory, FLOPs, collectives and the estimate."""

    job: str
    target: Target
    step: CompiledStep
    cost: ProgramCost
    estimate: Estimate
    model_flops: float  # per device per step, from the model's own flops()
    batch_size: int
    sequence_length: int

    @property
    def memory_bytes(self) -> int:
        return self.target.chip.memory_bytes

    @property
    def fits(self) -> bool:
        return self.step.fits_in(self.memory_bytes)

    @property
    def flops_ratio(self) -> float:
        """Compiled matmul FLOPs over the model's analytic FLOPs (1.0: no redundant work)."""
        return self.cost.flops / self.model_flops if self.model_flops else float("nan")

    @property
    def mesh(self) -> dict[str, int]:
        return {str(name): int(size) for name, size in self.step.trainer.sharding.mesh.shape.items()}


def make_plan(
    job_name: str,
    job: type,
    target_spec: str,
    overrides: Sequence[str],
    root: Path,
    *,
    config_file: Path | None = None,
    overlap: float = DEFAULT_OVERLAP,
    notice: Callable[[str], None] | None = None,
) -> Plan:
    """Build ``job`` as ``theseus run JOB overrides`` would, compile its step for ``target_spec``, analyse it;
    ``notice`` hears when the compile starts."""
    from theseus.plan.devices import captured_stderr, startup_log, target_devices

    if not 0.0 <= overlap <= 1.0:
        raise ConfigError(f"--overlap must lie between 0 and 1, got {overlap}")
    target = parse_target(target_spec)
    if not hasattr(job, "train_step_fn"):
        raise ConfigError(f"{job_name!r} is not a training job; theseus plan compiles a trainer's step")
    devices = target_devices(target)
    with rare_collections():  # tracing allocates millions of short-lived objects, as in a run
        trainer = build_trainer(job, devices, overrides, root, config_file)
        if notice is not None:  # once the configuration is known to be sound
            notice(f"compiling {job_name} for {target.describe()} (mesh {dict(trainer.sharding.mesh.shape)}) ...")
        with captured_stderr() as compiler_log:  # XLA's warnings (rematerialisation, scheduling): --verbose
            step, chosen = compiled_as_run(trainer, target)
        if notice is not None and chosen:
            notice(chosen)
    startup_log.extend(compiler_log)
    cost = analyse(step.text, target.devices)
    per_sequence = float(trainer.model.flops(trainer.sequence_length))
    model_flops = per_sequence * trainer.args.batch_size / target.devices
    return Plan(
        job=job_name,
        target=target,
        step=step,
        cost=cost,
        estimate=estimate(cost, target, overlap),
        model_flops=model_flops,
        batch_size=int(trainer.args.batch_size),
        sequence_length=int(trainer.sequence_length),
    )


def compiled_as_run(trainer: Any, target: Target) -> tuple[CompiledStep, str]:
    """The step a run on ``target`` would call, compiled, and the line about ``model/remat=auto`` (empty
    without it). With auto, the first pass of a run's ladder (:func:`~theseus.training.memory.first_pass`:
    ``none`` and ``dots`` at the configured micro batch, ``dots`` at half of it, ``full``) is compiled in its
    order, and the first whose step fits the chip is planned, as a run chooses it
    (:func:`theseus.training.memory.fit`). Where none fits, ``full`` is planned and the line says that a run
    would go on to halve the micro batch; the compiler's refusal of ``full`` is the plan's."""
    from theseus.training import memory

    if not memory.requested(trainer.context.config):
        return compile_train_step(trainer), ""
    room = memory.Budget(target.chip.memory_bytes, f"what a program may use on one {target.chip.name}")
    rows = int(trainer.args.micro_batch_size or 0) or int(trainer.args.batch_size)
    trials, step = memory.climb(trainer, memory.first_pass(rows, memory.splitter(trainer)), room)
    if isinstance(step, StepTooLarge):  # the compiler refused full too: that refusal is the plan's
        raise step
    if trials[-1].fits:
        step, kept = memory.keep_state_on_device(trainer, trials, step, room)
        return step, memory.Choice(trials[-1].candidate, tuple(trials), room, kept).line()
    tried = "; ".join(memory.needs(trial) for trial in trials)
    return step, (
        f"{memory.REMAT_KEY}={memory.AUTO}: nothing fits {room} at {rows} rows a pass ({tried}); planned as "
        f"remat=full, and a run would go on to halve {memory.MICRO_KEY} (plan that by naming it)"
    )


def compiled_remat(start: Plan | StepTooLarge) -> list[str]:
    """``model/remat=<policy>`` of the step ``start`` compiled (a plan, or the compiler's refusal): under
    auto the policy the ladder came to, else the one named. The search for the largest batch keeps it
    rather than compiling the ladder again at every batch."""
    from theseus.training import memory

    policy = start.step.trainer.context.config.get(memory.REMAT_KEY) if isinstance(start, Plan) else start.remat
    return [] if policy in (None, memory.AUTO) else [f"{memory.REMAT_KEY}={policy}"]


def with_batch(overrides: Sequence[str], batch_size: int) -> list[str]:
    """``overrides`` with ``training/batch_size`` replaced (the micro batch follows the batch)."""
    kept = [o for o in overrides if not o.startswith(("training/batch_size=", "training/micro_batch_size="))]
    return [*kept, f"training/batch_size={batch_size}"]


def largest_batch(
    plan_of: Callable[[int], Plan | None], start: Plan | None, batch_size: int, unit: int, *, limit: int = 1 << 16
) -> tuple[int, Plan | None, int]:
    """The largest global batch (a multiple of the data-parallel size ``unit``) whose step fits, by doubling
    then bisection over compiles, from ``start``, the plan at ``batch_size`` (None: that batch does not fit);
    ``(batch, its plan or None, compiles)``. ``plan_of(batch)`` gives None when the batch cannot be compiled
    (too large to split, or refused)."""
    compiles = 0
    if start is not None and start.fits:
        good, good_plan = batch_size, start
        bad = None
        while bad is None and good * 2 <= limit:
            compiles += 1
            candidate = plan_of(good * 2)
            if candidate is not None and candidate.fits:
                good, good_plan = good * 2, candidate
            else:
                bad = good * 2
        if bad is None:
            return good, good_plan, compiles
    else:
        good, good_plan, bad = 0, None, batch_size
    while bad - good > unit:
        middle = (good + bad) // 2 // unit * unit
        if middle <= good:
            break
        compiles += 1
        candidate = plan_of(middle)
        if candidate is not None and candidate.fits:
            good, good_plan = middle, candidate
        else:
            bad = middle
    if good == 0 and bad > unit:  # the smallest batch was not tried: try it
        compiles += 1
        candidate = plan_of(unit)
        if candidate is not None and candidate.fits:
            return unit, candidate, compiles
    return good, good_plan, compiles


def _shares(by_type: dict[str, float]) -> str:
    """`` (f8e4m3fn 71%, bf16 29%)``: the matmul FLOPs by input type, when there is more than one."""
    total = sum(by_type.values())
    if len(by_type) < 2 or total <= 0:
        return ""
    return " (" + ", ".join(f"{name or '?'} {value / total:.0%}" for name, value in by_type.items()) + ")"


def as_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plain values (``--json``); bytes are per device."""
    step, est = plan.step, plan.estimate
    return {
        "job": plan.job,
        "target": plan.target.spec,
        "devices": plan.target.devices,
        "device": plan.target.chip.name,
        "mesh": plan.mesh,
        "layout": step.trainer.sharding.layout,
        "batch_size": plan.batch_size,
        "sequence_length": plan.sequence_length,
        "parameters": step.parameters,
        "activation_dtype": activation_dtype(step.trainer),
        "memory": {
            "parameters": step.parameter_bytes,
            "optimizer_state": step.optimizer_bytes,
            "optimizer_state_in_host_memory": step.offloaded_bytes,
            "gradients": step.gradient_bytes,
            "batch": step.batch_bytes,
            "arguments": step.argument_bytes,
            "outputs": step.output_bytes,
            "aliased": step.alias_bytes,
            "temporaries": step.temporary_bytes,
            "summed": step.summed_bytes,
            "total": step.total_bytes,
            "device": plan.memory_bytes,
            "fits": plan.fits,
        },
        "flops": {
            "compiled": plan.cost.flops,
            "model": plan.model_flops,
            "ratio": plan.flops_ratio,
            "unknown_loop_counts": plan.cost.unknown_trip_counts,
            "by_input_type": plan.cost.flops_by_dtype(),
        },
        "collectives": plan.cost.collective_summary(),
        "custom_calls": plan.cost.custom_calls,
        "estimate": {
            "step_seconds": est.step_seconds,
            "compute_seconds": est.compute_seconds,
            "memory_seconds": est.memory_seconds,
            "collective_seconds": est.collective_seconds,
            "mfu": est.mfu(plan.model_flops),
            "tokens_per_second": plan.batch_size * plan.sequence_length / est.step_seconds if est.step_seconds else 0.0,
            "assumptions": est.assumptions(),
        },
        "compile_seconds": step.compile_seconds,
    }


def activation_dtype(trainer: Any) -> str:
    """The dtype the trainer's model computes in on its mesh's devices (``auto`` resolved)."""
    from theseus.base.accelerator import targeting

    with targeting(trainer.sharding.accelerator):
        return str(trainer.model._activation_dtype)


def _in_host_memory(memory: dict[str, Any]) -> str:
    offloaded = memory["optimizer_state_in_host_memory"]
    return f" (and {_gb(offloaded)} in host memory: optimizer/offload)" if offloaded else ""


def _gb(value: float) -> str:
    return f"{value / GB:,.2f} GB"


def render(plan: Plan) -> list[str]:
    """The plan as lines of text for the terminal."""
    data = as_dict(plan)
    memory, flops, est = data["memory"], data["flops"], data["estimate"]
    mesh = " x ".join(f"{name} {size}" for name, size in data["mesh"].items())
    margin = memory["device"] - memory["total"] - memory["batch"]
    verdict = f"fits ({_gb(margin)} free)" if plan.fits else f"does not fit: over by {_gb(-margin)}"
    lines = [
        f"{plan.job} on {plan.target.describe()}: compiled in {plan.step.compile_seconds:.1f} s, nothing allocated",
        f"  model      {plan.step.parameters / 1e9:,.3f}B parameters, {data['activation_dtype']} activations, "
        f"layout {data['layout']} (mesh {mesh}), batch {plan.batch_size} x {plan.sequence_length} tokens",
        "  memory per device",
        f"    parameters       {_gb(memory['parameters'])}",
        f"    optimizer state  {_gb(memory['optimizer_state'])}{_in_host_memory(memory)}",
        f"    gradients        {_gb(memory['gradients'])} (inside the temporaries)",
        f"    temporaries      {_gb(memory['temporaries'])}",
        f"    total            {_gb(memory['total'])} of {_gb(memory['device'])}: {verdict}",
        f"                     (the compiler's peak, buffers that never live together sharing memory; "
        f"all at once {_gb(memory['summed'])})",
        f"    donated state    {_gb(memory['aliased'])} of the outputs reuse the inputs' memory",
        "  FLOPs per device per step",
        f"    compiled (matmuls)  {flops['compiled'] / 1e12:,.2f} TFLOP{_shares(flops['by_input_type'])}",
        f"    model flops()       {flops['model'] / 1e12:,.2f} TFLOP   compiled / model = {flops['ratio']:.2f}",
    ]
    collectives = data["collectives"]
    if collectives:
        lines.append("  collectives per device per step")
        for name, entry in sorted(collectives.items()):
            lines.append(f"    {name:<19} {int(entry['count']):>6} x, {_gb(entry['moved_bytes'])} sent")
    else:
        lines.append("  collectives: none")
    lines += [
        f"  estimated step {est['step_seconds'] * 1e3:,.1f} ms (compute {est['compute_seconds'] * 1e3:,.1f}, "
        f"memory-bound {est['memory_seconds'] * 1e3:,.1f}, collectives {est['collective_seconds'] * 1e3:,.1f} ms), "
        f"{est['tokens_per_second']:,.0f} tokens/s, MFU {est['mfu']:.1%}",
        "  an estimate from the compiled program, not a measurement; assumed:",
        *(f"    - {line}" for line in est["assumptions"]),
    ]
    return lines


__all__ = ["Plan", "as_dict", "compiled_remat", "largest_batch", "make_plan", "render", "with_batch"]
