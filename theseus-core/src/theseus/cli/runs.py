"""``theseus runs``: list, show, compare and remove the runs under a root (never imports jax)."""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from theseus.cli.options import root_option
from theseus.errors import ConfigError, TheseusError
from theseus.runs import records
from theseus.runs.layout import PROFILE, profile_traces
from theseus.runs.lock import holder
from theseus.tracking import runs as data

ROOT_HELP = "Root holding runs/ (default $THESEUS_ROOT or ~/.theseus)."
#: Configuration prefixes ``runs show`` prints (the whole file is config.yaml in the run directory).
KEY_PREFIXES = ("training/", "architecture/", "mesh/", "metrics/sinks", "objective/")


def _root(root: Path | None) -> Path:
    from theseus.base.job import default_root
    from theseus.config.paths import absolute

    return absolute(root if root is not None else default_root())


def _human(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    hours, rest = divmod(round(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%d %H:%M")


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


#: The widest status cell of the listing (a failure's whole line is in ``runs show`` and ``--json``).
STATUS_WIDTH = 60


def _cell(text: str, width: int = STATUS_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    )


def _run_dir(root: Path, name: str) -> Path:
    """The directory of run ``name``; a missing run is an error naming the closest ones."""
    path = data.runs_dir(root) / name
    if name and "/" not in name and name not in (".", "..") and path.is_dir():
        return path
    import difflib

    names = sorted(p.name for p in data.run_dirs(root))
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; runs under {data.runs_dir(root)}: {len(names)}"
    raise ConfigError(f"no run {name!r} under {data.runs_dir(root)}{hint} (see 'theseus runs')")


@click.group(invoke_without_command=True)
@root_option(ROOT_HELP)
@click.option("--json", "as_json", is_flag=True, help="One JSON list of runs (stable keys) instead of a table.")
@click.option("--sort", type=click.Choice(sorted(data.SORTS)), default="name", show_default=True, help="Order.")
@click.option("--job", default=None, help="Only runs of this job (a glob such as 'gpt/*').")
@click.option(
    "--status",
    type=click.Choice([*data.STATUSES, "complete"]),  # "complete": the earlier name of "completed"
    default=None,
    help="Only runs in this state.",
)
@click.pass_context
def runs(ctx: click.Context, root: Path | None, as_json: bool, sort: str, job: str | None, status: str | None) -> None:
    """List runs: job, status, steps, best validation loss, tokens, wall time, last update."""
    ctx.ensure_object(dict)
    ctx.obj["runs_root"] = root
    if ctx.invoked_subcommand is not None:
        return
    status = "completed" if status == "complete" else status
    rows = data.list_runs(_root(root), sort=sort, job=job, status=status)
    if as_json:
        click.echo(json.dumps([r.as_json() for r in rows], indent=2, sort_keys=False))
        return
    if not rows:
        click.echo(f"no runs under {data.runs_dir(_root(root))}")
        return
    table = [
        (
            r.name,
            r.job or "-",
            _cell(r.label),
            f"{r.step}/{r.total_steps if r.total_steps is not None else '?'}",
            _loss(r.best_val_loss),
            _human(r.tokens),
            _duration(r.wall_time),
            _when(r.updated),
        )
        for r in rows
    ]
    click.echo(_table(table, ("NAME", "JOB", "STATUS", "STEP", "BEST VAL", "TOKENS", "WALL", "UPDATED (UTC)")))


def _root_option(ctx: click.Context, root: Path | None) -> Path:
    return _root(root if root is not None else (ctx.obj or {}).get("runs_root"))


@runs.command()
@click.argument("name")
@root_option(ROOT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Everything as one JSON object.")
@click.option(
    "--rollouts", is_flag=True, help="The rollouts the run logged (rl/log_completions) instead: the last step's."
)
@click.option("--step", type=int, default=None, help="With --rollouts: the rollouts of this step.")
@click.pass_context
def show(ctx: click.Context, name: str, root: Path | None, as_json: bool, rollouts: bool, step: int | None) -> None:
    """Selections, key configuration, provenance, last metrics and checkpoints of run NAME; with
    --rollouts, the prompts, turns, rewards and advantages of the rollouts it logged."""
    path = _run_dir(_root_option(ctx, root), name)
    if step is not None and not rollouts:
        raise ConfigError("--step selects the rollouts shown; use it with --rollouts")
    if rollouts:
        from theseus.cli.rollout_view import show_rollouts

        show_rollouts(path, name, step, as_json)
        return
    row = data.run_row(path)
    config = records.read_config(path)
    provenance = records.read_json(path / "provenance.json")
    last = data.last_records(records.read_metrics(path))
    ckpts = data.checkpoints(path)
    selections = {k: v for k, v in config.items() if "/" not in k}
    key_config = {k: v for k, v in config.items() if k.startswith(KEY_PREFIXES)}
    writer = holder(path)
    if as_json:
        record = {
            "run": row.as_json(),
            "path": str(path),
            "writer": writer,
            "selections": selections,
            "config": config,
            "provenance": provenance,
            "last_metrics": last,
            "checkpoints": ckpts,
            "trackers": {
                "wandb": records.read_json(path / "wandb.json") or None,
                "mlflow": records.read_json(path / "mlflow.json") or None,
            },
        }
        click.echo(json.dumps(record, indent=2, default=str))
        return
    status = row.label if writer is None else f"{row.label} ({_writer(writer)})"
    out = [f"run         {row.name}  ({path})", f"job         {row.job or '-'}", f"status      {status}"]
    total = row.total_steps if row.total_steps is not None else "?"
    out.append(f"progress    step {row.step}/{total}, {_human(row.tokens)} tokens, wall {_duration(row.wall_time)}")
    out.append(f"updated     {_when(row.updated)} UTC")
    if row.error and row.status != "failed":  # a failure's line is in its status already
        out.append(f"error       {row.error}")
    if selections:
        out.append("selections  " + ", ".join(f"{k}={v}" for k, v in sorted(selections.items())))
    out.append("configuration (all keys in config.yaml):")
    out += [f"  {k} = {v}" for k, v in sorted(key_config.items())]
    if provenance:
        out.append("provenance:")
        out.append(f"  job class   {provenance.get('job_class', '-')}")
        out.append(f"  model       {provenance.get('model', '-')}")
        if objective := provenance.get("objective"):
            values = ", ".join(f"{k}={v}" for k, v in (objective.get("values") or {}).items())
            out.append(f"  objective   {objective['class']}" + (f" ({values})" if values else ""))
        out.append(f"  started     {provenance.get('started', '-')} on {provenance.get('host', '-')}")
        versions = provenance.get("versions") or {}
        out.append("  versions    " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
        dists = provenance.get("distributions") or {}
        out.append("  installed   " + (", ".join(f"{k} {v}" for k, v in dists.items()) or "-"))
        plugins = provenance.get("plugins") or {}
        out.append("  plugins     " + (", ".join(f"{k} {v}" for k, v in plugins.items()) or "-"))
    traces = profile_traces(path)
    if traces:
        out.append(f"profile     {len(traces)} trace(s), newest {traces[-1]} (tensorboard --logdir {path / PROFILE})")
    trackers = _trackers(path)
    if trackers:
        out.append("trackers:")
        out += [f"  {line}" for line in trackers]
    out.append("last metrics:")
    for split, record in last.items():
        values = ", ".join(f"{k} {_format_value(v)}" for k, v in record.items() if k not in ("step", "split"))
        out.append(f"  {split} (step {record['step']}): {values}")
    if not last:
        out.append("  none")
    out.append("checkpoints:")
    for c in ckpts:
        best = "  best" if c["best"] else ""
        val = f"  val loss {c['val_loss']:.4f}" if c["val_loss"] is not None else ""
        out.append(f"  step {c['step']:>8}  {c['bytes'] / 1e6:9.2f} MB{val}{best}")
    if not ckpts:
        out.append("  none")
    click.echo("\n".join(out))


def _writer(record: dict[str, Any]) -> str:
    """``process 123 on host since ... UTC`` from a run lock's holder record."""
    if "pid" not in record:
        return "a process is starting it"
    since = f" since {record['since']} UTC" if record.get("since") else ""
    return f"process {record['pid']} on {record.get('host', '?')}{since}"


def _trackers(path: Path) -> list[str]:
    """Where the run's trackers keep it: TensorBoard event files, the W&B and MLflow run ids."""
    lines = []
    if any(path.glob("events.out.tfevents.*")):
        lines.append(f"tensorboard  tensorboard --logdir {path}")
    wandb_id = records.read_json(path / "wandb.json").get("id")
    if wandb_id:
        lines.append(f"wandb        run id {wandb_id} (local files in {path / 'wandb'})")
    mlflow = records.read_json(path / "mlflow.json")
    if mlflow.get("run_id"):
        lines.append(f"mlflow       run id {mlflow['run_id']} at {mlflow.get('tracking_uri')}")
    return lines


def _format_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@runs.command()
@click.argument("names", nargs=-1, required=True)
@root_option(ROOT_HELP)
@click.option("--metric", default="val/loss", show_default=True, help="Curve to compare, as split/name.")
@click.option("--x", "x_axis", type=click.Choice(["step", "tokens"]), default="step", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write the overlay PNG.")
@click.pass_context
def compare(
    ctx: click.Context, names: tuple[str, ...], root: Path | None, metric: str, x_axis: str, out: Path | None
) -> None:
    """Compare runs: METRIC of each (last, best), the configuration keys that differ, an overlay plot."""
    if len(names) < 2:
        raise ConfigError("theseus runs compare needs at least two runs: theseus runs compare A B [C ...]")
    if "/" not in metric:
        raise ConfigError(f"--metric {metric!r} must be split/name, such as val/loss or train/loss")
    root_dir = _root_option(ctx, root)
    paths = [_run_dir(root_dir, n) for n in names]
    histories = [records.read_metrics(p) for p in paths]
    curves = []
    for path, recs in zip(paths, histories, strict=True):
        tokens_per_step = (records.read_json(path / "status.json")).get("tokens_per_step")
        curves.append(data.series(recs, metric, x_axis, tokens_per_step if isinstance(tokens_per_step, int) else None))
    if not any(curves):
        available = sorted({m for recs in histories for m in data.metric_names(recs)})
        raise ConfigError(f"no run has metric {metric!r}; recorded metrics: {', '.join(available) or 'none'}")
    summary = [
        (
            name,
            str(len(points)),
            _format_value(points[-1][1]) if points else "-",
            _format_value(min(v for _, v in points)) if points else "-",
        )
        for name, points in zip(names, curves, strict=True)
    ]
    click.echo(_table(summary, ("RUN", "POINTS", f"LAST {metric}", f"MIN {metric}")))
    configs = [records.read_config(p) for p in paths]
    differing = data.config_differences(configs)
    click.echo("")
    if differing:
        rows = [(key, *(json.dumps(c[key]) if key in c else "-" for c in configs)) for key in differing]
        click.echo(_table(rows, ("KEY", *names)))
    else:
        click.echo("configurations are identical (apart from run/name)")
    if out is not None:
        _plot(curves, names, metric, x_axis, out)
        click.echo(f"\nwrote {out}")


def _plot(curves: list[list[tuple[float, float]]], names: tuple[str, ...], metric: str, x_axis: str, out: Path) -> None:
    from theseus.tracking.plots import figure

    out.parent.mkdir(parents=True, exist_ok=True)
    with figure(out, figsize=(7, 4.2)) as ax:
        for name, points in zip(names, curves, strict=True):
            if points:
                style = "o-" if len(points) < 30 else "-"
                ax.plot([x for x, _ in points], [v for _, v in points], style, label=name, linewidth=1.3, markersize=3)
        ax.set_xlabel(x_axis)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend()


@runs.command()
@click.argument("name")
@root_option(ROOT_HELP)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def rm(ctx: click.Context, name: str, root: Path | None, yes: bool) -> None:
    """Delete run NAME (its directory, checkpoints included) after confirmation."""
    path = _run_dir(_root_option(ctx, root), name)
    row = data.run_row(path)
    if row.status == "running":
        raise TheseusError(f"run {name!r} is running; stop it before removing {path}")
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    what = f"run {name!r} ({row.label}, {len(data.checkpoint_steps(path))} checkpoints, {size / 1e6:.1f} MB) at {path}"
    if not yes and not click.confirm(f"remove {what}?", default=False):
        click.echo("nothing removed")
        return
    shutil.rmtree(path)
    click.echo(f"removed {what}")
