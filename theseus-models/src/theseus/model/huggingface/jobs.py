"""The ``hf/import`` and ``hf/export`` jobs (light to import: the work lives in ``importer`` / ``exporter``).

theseus run hf/import hf/source=openai-community/gpt2 run/name=gpt2
theseus run hf/export hf/run=gpt2 hf/out=./gpt2-export hf/dtype=bfloat16
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from theseus.base.job import Job
from theseus.config import field
from theseus.errors import ConfigError
from theseus.runs.ref import RunRef


@dataclass
class ImportConfig:
    """Where the checkpoint comes from and the run it becomes."""

    source: str = field(
        "hf/source", default="", path="source", help="checkpoint folder, or hub repository id (needs huggingface_hub)"
    )
    revision: str = field("hf/revision", default="", help="hub branch, tag or commit (empty: main)")
    run_name: str = field("run/name", default="", help="run directory under <root>/runs to create")
    param_dtype: str = field("hf/param_dtype", default="float32", help="dtype of the imported parameters")


class HFImport(Job):
    """Convert a Hugging Face checkpoint (safetensors) into a theseus run with a step-0 checkpoint."""

    CONFIG = ImportConfig

    def run(self) -> None:
        from theseus.model.huggingface.importer import prepare, write_run
        from theseus.model.huggingface.source import resolve_source

        args: ImportConfig = self.args
        if not args.run_name:
            raise ConfigError("hf/import needs run/name=<name> for the run it creates")
        folder, source = resolve_source(args.source, args.revision)
        prepared = prepare(folder, {"model/param_dtype": args.param_dtype})
        arch = prepared.model.architecture
        path = write_run(self.context.root, args.run_name, prepared, source, type(self), self.context.name)
        click.echo(
            f"imported {prepared.checkpoint.imported.family} ({arch.n_layers} layers, {arch.n_embd} wide, "
            f"vocabulary {arch.vocab_size}) from {source['source']} into {path}",
            err=True,
        )


@dataclass
class ExportTarget:
    """Which run and checkpoint an export reads, and the folder it writes (``hf/export`` and
    ``hf/export-adapter``)."""

    run: str = field(
        "hf/run",
        default="",
        help="run NAME or NAME@STEP under <root>/runs (empty: the only run; no @STEP: the latest checkpoint)",
    )
    step: int = field("hf/step", default=-1, help="checkpoint step to export, as hf/run=NAME@STEP (-1: the latest)")
    out: str = field("hf/out", default="", path="file", help="output folder (created; must be empty if it exists)")

    def run_ref(self, root: Path) -> RunRef:
        """The run and checkpoint ``hf/run`` (and ``hf/step``) name, not yet resolved."""
        return RunRef.parse(self.run, root, key="hf/run").at(self.step, step_key="hf/step")


@dataclass
class ExportConfig(ExportTarget):
    """Which run and checkpoint to export, where, and in which dtype."""

    dtype: str = field("hf/dtype", default="float32", help="float32 | bfloat16")
    shard_size: str = field(
        "hf/shard_size", default="5GB", help="largest safetensors file before sharding (e.g. 5GB, 500MB)"
    )


class HFExport(Job):
    """Write a run's checkpoint as a Hugging Face folder that transformers' ``from_pretrained`` loads."""

    CONFIG = ExportConfig

    def run(self) -> None:
        from theseus.model.huggingface.exporter import export_run

        args: ExportConfig = self.args
        out = export_run(
            self.context.root, args.run_ref(self.context.root), args.out, dtype=args.dtype, shard_size=args.shard_size
        )
        click.echo(f"exported to {out}", err=True)
