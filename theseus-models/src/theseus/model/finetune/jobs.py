"""``hf/export-adapter``: write a LoRA run's adapters in PEFT's format (light to import)."""

from __future__ import annotations

from dataclasses import dataclass

import click

from theseus.base.job import Job
from theseus.config import field
from theseus.model.huggingface.jobs import ExportTarget


@dataclass
class AdapterExportConfig(ExportTarget):
    """Which run and checkpoint, where to write, and the base model the adapter names."""

    base: str = field(
        "hf/base", default="", help="base_model_name_or_path written in adapter_config.json (empty: training/init_from)"
    )


class AdapterExport(Job):
    """Write a LoRA run's adapters as ``adapter_config.json`` + ``adapter_model.safetensors`` for PEFT."""

    CONFIG = AdapterExportConfig

    def run(self) -> None:
        from theseus.model.finetune.peft_export import export_adapter

        args: AdapterExportConfig = self.args
        out = export_adapter(self.context.root, args.run_ref(self.context.root), args.out, base=args.base)
        click.echo(f"exported the adapters to {out}", err=True)
