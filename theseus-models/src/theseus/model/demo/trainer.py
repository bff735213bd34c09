"""``demo/gpt``: train a small byte-level GPT-style model on the Python standard library, then let it write.

Needs nothing downloaded and no prior step: the corpus (every ``.py`` file of this interpreter's
standard library, byte-level) is prepared into ``<root>/data/python-stdlib`` when missing. Running
the job again resumes an unfinished run, or reports that it is complete and prints samples again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from theseus.base.job import default_root
from theseus.config import configuration, field
from theseus.evaluation import Compression
from theseus.model.models import Llama
from theseus.runs.records import read_metrics
from theseus.tracking.runs import last_records
from theseus.training.base import BaseTrainer
from theseus.training.config import BaseTrainerConfig
from theseus.training.flywheel.strategy import Sampling
from theseus.training.optimizers import Muon

DATASET_NAME = "python-stdlib"


@dataclass
class DemoConfig(BaseTrainerConfig):
    """The trainer keys with the demo's defaults (a few minutes on 2 CPU cores: many small steps
    learn more per second there than few large ones), plus the samples printed at the end."""

    steps: int = field("training/steps", default=1350, min=1, help="optimizer steps of the whole run")
    batch_size: int = field("training/batch_size", default=8, help="global rows (sequences) per optimizer step")
    sequence_length: int = field(
        "training/sequence_length", default=128, help="tokens per row (0 = the model's architecture/block_size)"
    )
    lr: float = field("training/lr", default=3e-3, above=0.0, help="peak learning rate (the schedule scales it)")
    log_interval: int = field("training/log_interval", default=50, help="write training metrics every N steps")
    eval_interval: int = field(
        "training/eval_interval", default=500, help="validate every N steps and at the end (0 = only at the end)"
    )
    eval_batches: int = field("training/eval_batches", default=40, help="batches per validation (0 = no validation)")
    checkpoint_interval: int = field(
        "training/checkpoint_interval", default=1000, help="checkpoint every N steps (0 = only the final checkpoint)"
    )
    keep_checkpoints: int = field(
        "training/keep_checkpoints", default=2, help="latest checkpoints kept, besides the best one (0 = keep all)"
    )
    prompts: list[str] = field(
        "demo/prompts",
        default_factory=lambda: ["def ", "import ", "class "],
        help="prompts of the samples printed at the end",
    )
    max_new_tokens: int = field("demo/max_new_tokens", default=120, help="most bytes generated per sample")
    temperature: float = field("demo/temperature", default=1.0, help="sampling temperature (0 = greedy)")
    top_p: float = field("demo/top_p", default=0.9, help="nucleus sampling probability mass (1 = off)")
    sample_seed: int = field("demo/seed", default=0, help="seed of the samples")


class DemoGPT(BaseTrainer):
    """A two-layer byte-level decoder with Llama's blocks (the ``tiny`` preset's width: 128, 2 query
    heads sharing one key/value head; rotary positions, SwiGLU, RMSNorm; vocabulary 257, unpadded)
    trained on the Python standard library, 128 bytes of context, with Muon and a warmup-stable-decay
    schedule; validates, checkpoints, plots ``loss.png``, scores the whole validation split in bits
    per byte and finishes by printing samples of ``demo/prompts``.

    Every key can be overridden as usual (``architecture/n_layers=4 training/steps=6000``).
    """

    JOB_KEY = "demo/gpt"
    CONFIG = DemoConfig
    #: Llama's blocks learn far more per step here than GPT-2's (learned positions, GELU,
    #: LayerNorm, tied head): 1.96 against 2.13 bits/byte after 1150 steps with everything else equal,
    #: at about the same step time with one key/value head (benchmarks/README.md, demo speedrun).
    MODEL = Llama
    DATASET = Sampling(DATASET_NAME, 1.0, "pmd")
    #: At equal steps, warmup-stable-decay ends lower than cosine here (2.46 vs 2.52 bits/byte).
    SCHEDULE = "wsd"
    #: Muon (orthogonalised updates for the hidden matrices, attention's included) ends far lower
    #: than AdamW in about the same CPU time: with GPT-2's blocks, 2.16 against 2.32 bits/byte on
    #: the whole validation split (2.13 with the DEFAULTS below).
    #: Its Newton-Schulz steps cost the same per step whatever the batch, so 8 rows of 128 bytes
    #: per step suit it better than 4.
    OPTIMIZER = Muon
    #: Two layers of the tiny preset learn more in a few CPU minutes than its four. Two heads and
    #: the unpadded vocabulary make a CPU step about a fifth cheaper (fewer softmax maps, a 257- rather
    #: than 384-wide output head), which pays for the extra steps. One key/value head makes a step
    #: a sixth cheaper than two (0.83x in the bare loop) and ends as low at equal steps.
    #: Muon without weight decay, its AdamW part (embeddings, head, norms) at twice the learning rate,
    #: and the last 40 % of the steps decaying: together 0.04 bits/byte lower at two seeds.
    DEFAULTS = {
        "architecture/n_layers": 2,
        "architecture/n_heads": 2,
        "architecture/n_kv_heads": 1,
        "architecture/vocab_multiple": 1,
        "optimizer/muon/weight_decay": 0.0,
        "optimizer/muon/adam_lr_ratio": 2.0,
        "schedule/wsd/decay_fraction": 0.4,
    }
    #: At the end: bits per byte of the whole validation split, each byte predicted once, in order,
    #: from the 64-127 bytes before it, as a compressor codes it (``benchmarks/demo_speedrun.py``
    #: sets it beside gzip, bz2 and xz).
    EVALUATION = [Compression]

    def prepare_data(self) -> None:
        """Tokenize the standard library into ``<root>/data/python-stdlib`` unless it is there."""
        from theseus.data.datasets.stdlib import prepare_stdlib

        with configuration(self.context.config):
            prepared = prepare_stdlib(self.context.root, note=lambda text: click.echo(text, err=True))
        splits = ", ".join(f"{name} {info.tokens:,} bytes" for name, info in prepared.header.splits.items())
        click.echo(f"corpus {DATASET_NAME}: {splits}", err=True)

    def run(self) -> None:
        self.prepare_data()
        super().run()
        self.report()

    def report(self) -> None:
        """Print the final validation loss in bits per byte and samples from the latest checkpoint.

        Only process 0 reports in a multi-process run.
        """
        import jax

        from theseus.model.generation import SamplingParams, complete, load_run

        if jax.process_index() != 0:
            return
        args: DemoConfig = self.args
        run = load_run(self.context.root, self.run_name)
        last = last_records(read_metrics(run.path))
        val = validation_of(last)
        if val is not None:
            step, loss = val
            click.echo(
                f"validation at step {step}: loss {loss:.4f} nats/byte = {loss / math.log(2):.3f} bits/byte "
                f"(uniform bytes: {math.log(256) / math.log(2):.0f} bits/byte)"
            )
        whole = compression_of(last)
        if whole is not None:
            bits, size = whole
            click.echo(f"whole validation split ({size:,} bytes, each predicted once, in order): {bits:.3f} bits/byte")
        if not args.prompts:
            return
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p)
        samples = complete(
            run,
            list(args.prompts),
            args.max_new_tokens,
            sampling=sampling,
            seed=args.sample_seed,
            note=lambda text: click.echo(text, err=True),
        )
        click.echo(f"samples from step {run.step} ({sampling.describe()}, seed {args.sample_seed}):")
        for sample in samples:
            click.echo(f"----- {sample.prompt!r} -----")
            click.echo(sample.text)
        where = "" if self.context.root == default_root() else f" --root {self.context.root}"
        click.echo(f"more: theseus run generate{where} generate/run={run.name} generate/prompt='def '")


def last_validation(run_dir: Path) -> tuple[int, float] | None:
    """``(step, loss)`` of the last validation record in the run's metrics, if any."""
    return validation_of(last_records(read_metrics(run_dir)))


def validation_of(last: Mapping[str, Mapping[str, Any]]) -> tuple[int, float] | None:
    """``(step, loss)`` of the last validation record, from the last record of each split."""
    record = last.get("val")
    if record is None or not isinstance(record.get("loss"), (int, float)):
        return None
    return int(record["step"]), float(record["loss"])


def compression_of(last: Mapping[str, Mapping[str, Any]]) -> tuple[float, int] | None:
    """``(bits per byte, bytes)`` of the last ``compression`` evaluation, from the last record of each split."""
    record = last.get("eval")
    if record is None or not isinstance(record.get("compression/bits_per_byte"), (int, float)):
        return None
    return float(record["compression/bits_per_byte"]), int(record.get("compression/bytes", 0))
