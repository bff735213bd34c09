"""The ``eval/harness`` job: a run's checkpoint on lm-evaluation-harness tasks, in process.

theseus run eval/harness eval/run=NAME eval/tasks=hellaswag,arc_easy eval/limit=100
theseus run eval/harness eval/run=NAME@2000 eval/tasks=my_task eval/include_path=tasks/ eval/out=out.json

It writes lm-eval's results JSON (and ``samples_<task>.jsonl`` with ``eval/log_samples=true``) and
prints lm-eval's table of the metrics. lm-eval is imported only when the job runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from theseus.base.job import Job
from theseus.config import field
from theseus.runs.ref import RunRef

if TYPE_CHECKING:
    from theseus.config import Configuration
    from theseus.training.sharding import TrainerSharding


@dataclass
class HarnessConfig:
    """Which run and checkpoint, which lm-eval tasks and how many documents, and where results go."""

    run: str = field(
        "eval/run", default="", help="run NAME or NAME@STEP under <root>/runs (empty: the only run; no @STEP: latest)"
    )
    tasks: str = field("eval/tasks", default="", help="comma-separated lm-eval task, group or tag names (globs too)")
    include_path: str = field(
        "eval/include_path", default="", path="file", help="a folder of task YAML files (lm_eval --include_path)"
    )
    num_fewshot: int = field(
        "eval/num_fewshot", default=-1, min=-1, help="few-shot examples per prompt (-1: each task's default)"
    )
    limit: int = field("eval/limit", default=0, min=0, help="documents per task (0: all of them)")
    batch_size: int = field("eval/batch_size", default=8, min=1, help="rows per forward pass and per generation batch")
    out: str = field(
        "eval/out", default="", path="file", help="results JSON file, or a folder (empty: <run>/harness/<step>/)"
    )
    log_samples: bool = field(
        "eval/log_samples", default=False, help="also write every request and response as samples_<task>.jsonl"
    )
    layout: Literal["", "dp", "fsdp", "tp", "fsdp+tp"] = field(
        "eval/layout", default="", help="how the parameters are sharded over the devices (empty: as the run trained)"
    )
    mesh_model: int = field(
        "eval/mesh_model",
        default=0,
        min=0,
        help="model axis of the mesh (0: the run's mesh/model where it divides the devices, else 1)",
    )


def parse_run(root: Path, spec: str) -> RunRef:
    """The run and checkpoint ``eval/run`` names (``NAME``, ``NAME@STEP`` or empty: the only run; without
    a step its latest checkpoint), checked to exist before jax and the model load."""
    return RunRef.parse(spec, root, key="eval/run").resolve()


class HarnessEval(Job):
    """Evaluate a run's checkpoint with lm-evaluation-harness (loglikelihood, rolling and generation tasks)."""

    CONFIG = HarnessConfig

    def run(self) -> None:
        from theseus.model.harness.dependency import require_lm_eval

        require_lm_eval("eval/harness")
        from theseus.model.harness import tasks

        args: HarnessConfig = self.args
        root = self.context.root
        ref = parse_run(root, args.run)
        selection = tasks.choose(args.tasks, args.include_path, key="eval/tasks", include_key="eval/include_path")
        tasks.load(selection)  # the data and what each task asks for, checked before jax and the model load
        from theseus.config import Configuration, read_yaml
        from theseus.model.harness import results, runner
        from theseus.model.harness.compute import Devices
        from theseus.model.harness.lockstep import Lockstep
        from theseus.model.harness.model import TheseusLM
        from theseus.model.harness.scoring import score_function
        from theseus.model.loading.run import load_run
        from theseus.runs.layout import CONFIG_FILE

        trained = Configuration(read_yaml(ref.path / CONFIG_FILE))
        run = load_run(root, ref, mesh=lambda model: mesh_for(model, trained, args.layout, args.mesh_model))
        lockstep = Lockstep(Devices(run.model, run.params, score_function(run.model), run.sharding))
        if lockstep.leads:
            click.echo(
                f"{run.name} step {run.step}: {type(run.model).__name__} {run.parameters / 1e6:.2f}M parameters "
                f"({describe(run.sharding)}); lm-eval tasks {', '.join(selection.names)}",
                err=True,
            )
        lm = TheseusLM.from_run(run, batch_size=args.batch_size, compute=lockstep)
        options = runner.Options(num_fewshot=args.num_fewshot, limit=args.limit, log_samples=args.log_samples)
        model_args = {"run": run.name, "step": run.step}
        found = lockstep.lead(lambda: runner.evaluate(lm, selection, options, model_args=model_args))
        if found is None or not lockstep.leads:
            return
        written = results.write(found, args.out or run.path / "harness" / str(run.step))
        click.echo(results.table(found))
        click.echo(f"wrote {', '.join(str(path) for path in written)}", err=True)


def mesh_for(model: Any, trained: Configuration, layout: str, mesh_model: int) -> TrainerSharding:
    """The mesh ``model`` is evaluated on: every device of every process, in ``layout`` (empty: the
    run's ``mesh/layout`` from its ``trained`` configuration) with a model axis of ``mesh_model``
    (0: the run's ``mesh/model`` where it divides the devices, else 1)."""
    import jax

    from theseus.base.axis import MeshAxis
    from theseus.training.sharding import LAYOUTS, build_sharding

    layout = layout or str(trained.get("mesh/layout") or "dp")
    if layout not in LAYOUTS:
        layout = "dp"
    if not mesh_model:
        wanted = int(trained.get("mesh/model") or 1)
        fits = wanted > 0 and jax.device_count() % wanted == 0 and MeshAxis.MODEL in LAYOUTS[layout]
        mesh_model = wanted if fits else 1
    expert = 1
    if MeshAxis.EXPERT in LAYOUTS[layout]:  # the run's expert axis, where it fits beside the model axis
        wanted = int(trained.get("mesh/expert") or 1)
        expert = wanted if wanted > 0 and jax.device_count() % (wanted * mesh_model) == 0 else 1
    return build_sharding(model.sharding, layout=layout, data=-1, model=mesh_model, expert=expert)


def describe(sharding: TrainerSharding | None) -> str:
    """``fsdp over 4 devices (data 4 x model 1)``, ``ep over 4 devices (expert 4 x data 1 x model 1)``."""
    if sharding is None:
        return "one device"
    axes = " x ".join(f"{name} {size}" for name, size in sharding.mesh.shape.items())
    return f"{sharding.layout} over {sharding.mesh.size} devices ({axes})"
