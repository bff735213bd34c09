"""The ``theseus`` command line."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from theseus.cli.options import config_option, root_option
from theseus.errors import TheseusError

#: Built-in command groups imported only when used, so that ``theseus jobs`` does not load them.
LAZY_COMMANDS = {
    "new": "theseus.cli.scaffold:new",
    "plan": "theseus.cli.plan:plan",
    "runs": "theseus.cli.runs:runs",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("theseus-core")
    except PackageNotFoundError:
        return "unknown"


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"theseus, version {_version()}")
        ctx.exit()


def _lazy(name: str) -> click.Command:
    module, _, attribute = LAZY_COMMANDS[name].partition(":")
    command: click.Command = getattr(importlib.import_module(module), attribute)
    return command


class TheseusGroup(click.Group):
    """A click group that also runs commands contributed by plugins.

    Listing (``--help``, completion) names the built-in commands only and imports no plugin; a
    name that is not built in asks the plugins' ``theseus_cli_commands`` hooks, which imports them.
    """

    def _plugin_commands(self) -> dict[str, click.Command]:
        from theseus.cli.listing import plugin_commands
        from theseus.plugins.discovery import plugins

        return {name: command for name, (_dist, command) in plugin_commands(plugins()).items()}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        if cmd_name in LAZY_COMMANDS:
            return _lazy(cmd_name)
        return self._plugin_commands().get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command: whatever it is, a full disk, a read-only or forbidden path or no memory ends it
        as one :class:`~theseus.errors.ResourceError` line (:mod:`theseus.base.failures`)."""
        try:
            return super().invoke(ctx)
        except Exception as exc:
            from theseus.base.failures import resource_error
            from theseus.cli.options import given_root

            name = f"theseus {ctx.invoked_subcommand}" if ctx.invoked_subcommand else "theseus"
            error = resource_error(exc, name, given_root(ctx), {})
            if error is None:
                raise
            raise error from exc

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            import difflib

            name = args[0] if args else ""
            known = set(self.list_commands(ctx))
            with contextlib.suppress(TheseusError):
                known |= set(self._plugin_commands())  # imported already, to look the name up
            close = difflib.get_close_matches(name, sorted(known), n=1)
            if close:
                raise click.UsageError(f"no command {name!r}; did you mean {close[0]!r}?") from exc
            raise


@click.group(
    cls=TheseusGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Installed plugins may add commands of their own; 'theseus plugins' lists them.",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and exit.",
)
@click.option("--verbose", "-v", is_flag=True, help="Show full tracebacks on errors.")
@click.option(
    "--load",
    "loads",
    multiple=True,
    metavar="FILE_OR_MODULE",
    help="Import a .py file or module holding @job classes (repeatable).",
)
@click.pass_context
def cli(ctx: click.Context, verbose: bool, loads: tuple[str, ...]) -> None:
    """theseus: train language models with JAX, extended by plugins."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    if loads:
        from theseus.cli.loading import load_user_code

        for target in loads:
            load_user_code(target)


@cli.command()
def jobs() -> None:
    """List the jobs of every installed distribution (and --load files)."""
    from theseus.cli.listing import list_jobs
    from theseus.registry import get_registry

    list_jobs(get_registry())


@cli.command()
@click.argument("component", required=False, metavar="[KIND|KIND/NAME]")
@click.option("--kind", default=None, help="Only this kind (model, dataset, optimizer, ...).")
def components(component: str | None, kind: str | None) -> None:
    """List registered components, or show one (KIND/NAME): its keys, types, defaults and provider."""
    from theseus.cli.listing import list_components
    from theseus.registry import get_registry

    if component is not None and "/" in component:
        from theseus.cli.component_detail import show_component

        show_component(get_registry(), component)
        return
    list_components(get_registry(), kind or component)


@cli.command()
def plugins() -> None:
    """Show installed plugin distributions, what they register, and failures."""
    from theseus.cli.listing import list_plugins
    from theseus.plugins.discovery import plugins as get_plugins
    from theseus.registry import get_registry

    get_registry()
    list_plugins(get_plugins())


@cli.command()
@click.argument("job")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("overrides", nargs=-1)
def configure(job: str, out: Path, overrides: tuple[str, ...]) -> None:
    """Write JOB's full configuration (defaults + overrides) to OUT.yaml."""
    from theseus.cli.running import configure_job

    configure_job(job, out, list(overrides))


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("job")
@click.argument("overrides", nargs=-1)
@config_option
@root_option()
@click.option("--coordinator", default=None, help="host:port of process 0 for multi-process runs.")
@click.option("--num-processes", type=int, default=None, help="Number of processes in a multi-process run.")
@click.option("--process-id", type=int, default=None, help="This process's index in a multi-process run.")
@click.pass_context
def run(
    ctx: click.Context,
    job: str,
    overrides: tuple[str, ...],
    config_file: Path | None,
    root: Path | None,
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
) -> None:
    """Run JOB with its configuration (--config YAML, then key=value overrides)."""
    from theseus.cli.running import run_job

    distributed: dict[str, Any] = {
        "coordinator": coordinator,
        "num_processes": num_processes,
        "process_id": process_id,
    }
    run_job(job, list(overrides), config_file, root, verbose=ctx.obj["verbose"], distributed=distributed)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user mistakes become one ``error:`` line and a non-zero exit.

    Without ``argv`` (the ``theseus`` command itself) a failed command ends the process even when
    background threads are stuck (:mod:`theseus.cli.exiting`); with ``argv`` (called from Python) it
    raises ``SystemExit`` as usual."""
    from theseus.base.accelerator import quiet_absent_accelerators
    from theseus.cli.exiting import exit_after_failure

    quiet_absent_accelerators()
    leave: Callable[[int], NoReturn] = sys.exit
    if argv is None:  # the process is the command's own
        from theseus.training.collector import rare_collections_for_the_process

        leave = exit_after_failure
        receive_stop_signals()
        rare_collections_for_the_process()
    args = sys.argv[1:] if argv is None else argv
    verbose = "--verbose" in args or "-v" in args
    try:
        cli.main(args=args, prog_name="theseus", standalone_mode=False)
        if argv is None:
            from theseus.training.collector import leave_heap_to_exit

            leave_heap_to_exit()
    except TheseusError as exc:
        if verbose:
            import traceback

            traceback.print_exc()
        # A plain exit (a preempted run that checkpointed) is a notice, not an error.
        click.echo(str(exc) if getattr(exc, "plain", False) else f"error: {exc}", err=True)
        leave(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        leave(130)
    except click.ClickException as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if isinstance(exc, click.UsageError) and exc.ctx else ""
        click.echo(f"error: {exc.format_message()}{hint}", err=True)
        leave(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        leave(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception:  # a defect, not a user mistake: its traceback, then the same bounded exit
        if argv is not None:
            raise
        import traceback

        traceback.print_exc()
        leave(1)


def receive_stop_signals() -> None:
    """Unblock SIGINT and SIGTERM in this process: a blocked signal is inherited from whatever started the
    command (a launcher, a test runner's process), and Ctrl-C or a scheduler's SIGTERM would then never
    arrive. An ignored one (a job started in the background with ``nohup``) stays ignored, as asked."""
    import signal

    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


if __name__ == "__main__":
    main()
