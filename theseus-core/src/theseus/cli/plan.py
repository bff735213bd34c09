"""``theseus plan``: compile a job's training step for accelerators this machine does not have."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from theseus.cli.options import config_option, root_option
from theseus.errors import TheseusError
from theseus.plan.estimate import DEFAULT_OVERLAP
from theseus.plan.targets import EXAMPLES

if TYPE_CHECKING:
    from theseus.plan.build import StepTooLarge
    from theseus.plan.report import Plan
    from theseus.plan.targets import Target


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


@click.command(context_settings={"ignore_unknown_options": False})
@click.argument("job")
@click.argument("overrides", nargs=-1)
@click.option("--target", "target_spec", required=True, help=f"What to compile for: {EXAMPLES}.")
@config_option
@root_option("Root whose prepared data (if any) sets the batch format (default $THESEUS_ROOT or ~/.theseus).")
@click.option(
    "--max-batch", is_flag=True, help="Also find the largest global batch that fits (bisection over compiles)."
)
@click.option(
    "--overlap", type=float, default=DEFAULT_OVERLAP, show_default=True, help="Share of collective time hidden."
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.pass_context
def plan(
    ctx: click.Context,
    job: str,
    overrides: tuple[str, ...],
    target_spec: str,
    config_file: Path | None,
    root: Path | None,
    max_batch: bool,
    overlap: float,
    as_json: bool,
) -> None:
    """Compile JOB's training step for TARGET without the hardware: memory per device, FLOPs,
    collectives and an estimated step time (key=value overrides as for 'theseus run')."""
    from theseus.plan.devices import require_compiler, start_cpu_backend, startup_log
    from theseus.plan.targets import parse_target

    target = parse_target(target_spec)
    require_compiler(target.platform)  # one line before anything heavy is imported
    start_cpu_backend()
    from theseus.base.job import default_root
    from theseus.config.paths import absolute
    from theseus.plan.build import StepTooLarge
    from theseus.plan.report import as_dict, compiled_remat, make_plan, render, with_batch
    from theseus.registry import get_registry

    cls = get_registry().load_job(job)
    planned_root = absolute(root or default_root())

    def plan_of(settings: Sequence[str], notice: Callable[[str], None] | None = None) -> Plan:
        return make_plan(
            job, cls, target_spec, settings, planned_root, config_file=config_file, overlap=overlap, notice=notice
        )

    notice = None if as_json else (lambda line: click.echo(line, err=True))
    try:
        start: Plan | StepTooLarge = plan_of(overrides, notice)
    except StepTooLarge as refusal:  # a TPU compiler refuses a step larger than the chip
        if not max_batch:
            raise
        start = refusal
    if ctx.obj and ctx.obj.get("verbose") and startup_log:
        click.echo("\n".join(startup_log), err=True)

    def batch_plan(batch: int) -> Plan | None:
        if not as_json:
            click.echo(f"  trying batch {batch} ...", err=True)
        try:
            return plan_of([*with_batch(overrides, batch), *compiled_remat(start)])
        except TheseusError:  # a batch the layout cannot split or the compiler refuses counts as not fitting
            return None

    if max_batch or isinstance(start, StepTooLarge):  # (refused only with --max-batch)
        report, lines = largest_batch_report(job, target, start, batch_plan)
    else:
        report, lines = as_dict(start), render(start)
    click.echo(json.dumps(report, indent=2) if as_json else "\n".join(lines))


def largest_batch_report(
    job: str, target: Target, start: Plan | StepTooLarge, plan_of: Callable[[int], Plan | None]
) -> tuple[dict[str, Any], list[str]]:
    """The plan at the requested batch, or the compiler's refusal of it followed by the plan of the largest
    batch that fits, and that batch: as JSON and as lines."""
    from theseus.plan.build import StepTooLarge
    from theseus.plan.report import as_dict, largest_batch, render

    if isinstance(start, StepTooLarge):
        best, best_plan, compiles = largest_batch(plan_of, None, start.batch_size, start.unit)
        requested = {"batch_size": start.batch_size, "fits": False, "needed_bytes": start.needed_bytes}
        refused = f"{start.batch_size} x {start.sequence_length} tokens do not fit (the compiler {start.amount()})"
        lines = [f"{job} on {target.describe()}: {refused}"]
        report: dict[str, Any] = {"job": job, "target": target.spec, "devices": target.devices}
        if best_plan is not None:
            lines += render(best_plan)
            report = as_dict(best_plan)
        report["requested"] = requested
    else:
        unit = start.step.trainer.sharding.data_size
        best, best_plan, compiles = largest_batch(plan_of, start, start.batch_size, unit)
        report, lines = as_dict(start), render(start)
    report["max_batch"] = {"batch_size": best, "compiles": compiles}
    if best_plan is None:
        lines.append(f"  no batch fits on {target.describe()} ({plural(compiles, 'more compile')})")
        return report, lines
    report["max_batch"]["total_bytes"] = best_plan.step.total_bytes
    lines.append(
        f"  largest batch that fits: {best} x {best_plan.sequence_length} tokens "
        f"({best_plan.step.total_bytes / 1e9:,.2f} GB per device; {plural(compiles, 'more compile')})"
    )
    return report, lines
