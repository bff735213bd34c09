"""``hf/export-adapter``: write a LoRA run's adapters in PEFT's format (light to import)."""

from __future__ import annotations

from dataclasses import dataclass

import click

from theseus.base.job import Job
from theseus.config import field


@dataclass
class AdapterExportConfig:
    """Which run and checkpoint, where to write, and the base model the adapter names."""

    run: str = field("hf/run", default="", help="run name under <root>/runs (empty: the only run there is)")
    step: int = field("hf/step", default=-1, help="checkpoint step to export (-1 = the latest)")
    out: str = field("hf/out", default="", path="file", help="output folder (created; must be empty if it exists)")
    base: str = field(
        "hf/base", default="", help="base_model_name_or_path written in adapter_config.json (empty: training/init_from)"
    )


class AdapterExport(Job):
    """Write a LoRA run's adapters as ``adapter_config.json`` + ``adapter_model.safetensors`` for PEFT."""

    CONFIG = AdapterExportConfig

    def run(self) -> None:
        from theseus.model.finetune.peft_export import export_adapter

        args: AdapterExportConfig = self.args
        out = export_adapter(
            self.context.root, args.run, args.out, step=None if args.step < 0 else args.step, base=args.base
        )
        click.echo(f"exported the adapters to {out}", err=True)
