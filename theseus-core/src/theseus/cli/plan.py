"""``theseus plan``: compile a job's training step for accelerators this machine does not have."""

from __future__ import annotations

import json
from pathlib import Path

import click

from theseus.cli.options import config_option, root_option
from theseus.errors import TheseusError
from theseus.plan.estimate import DEFAULT_OVERLAP
from theseus.plan.targets import EXAMPLES


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

    require_compiler(parse_target(target_spec).platform)  # one line before anything heavy is imported
    start_cpu_backend()
    from theseus.base.job import default_root
    from theseus.config.paths import absolute
    from theseus.plan.report import as_dict, largest_batch, make_plan, render, with_batch
    from theseus.registry import get_registry

    cls = get_registry().load_job(job)
    root = absolute(root or default_root())
    notice = None if as_json else (lambda line: click.echo(line, err=True))
    result = make_plan(job, cls, target_spec, overrides, root, config_file=config_file, overlap=overlap, notice=notice)
    if ctx.obj and ctx.obj.get("verbose") and startup_log:
        click.echo("\n".join(startup_log), err=True)
    report = as_dict(result)
    lines = render(result)
    if max_batch:

        def plan_of(batch: int) -> object:
            if not as_json:
                click.echo(f"  trying batch {batch} ...", err=True)
            try:
                return make_plan(
                    job, cls, target_spec, with_batch(overrides, batch), root, config_file=config_file, overlap=overlap
                )
            except TheseusError:  # a batch the layout cannot split or the compiler refuses counts as not fitting
                return None

        best, best_plan, compiles = largest_batch(plan_of, result)  # type: ignore[arg-type]
        report["max_batch"] = {"batch_size": best, "compiles": compiles}
        if best_plan is not None:
            report["max_batch"]["total_bytes"] = best_plan.step.total_bytes
            lines.append(
                f"  largest batch that fits: {best} x {result.sequence_length} tokens "
                f"({best_plan.step.total_bytes / 1e9:,.2f} GB per device; {plural(compiles, 'more compile')})"
            )
        else:
            lines.append(f"  no batch fits on {result.target.describe()} ({plural(compiles, 'more compile')})")
    click.echo(json.dumps(report, indent=2) if as_json else "\n".join(lines))
