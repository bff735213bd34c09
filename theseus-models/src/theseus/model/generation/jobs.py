"""The ``generate`` job: sample text from any training run's checkpoint.

theseus run generate generate/run=demo-gpt generate/prompt="def " generate/temperature=0.8
echo "import os" | theseus run generate generate/prompt=- generate/samples=3
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import click

from theseus.base.job import Job
from theseus.config import field
from theseus.errors import ConfigError
from theseus.runs.ref import RunRef


@dataclass
class GenerateConfig:
    """Which run and checkpoint to sample from, the prompt, and how to draw tokens."""

    run: str = field(
        "generate/run",
        default="",
        help="run NAME or NAME@STEP under <root>/runs (empty: the only run; no @STEP: the latest checkpoint)",
    )
    prompt: str = field("generate/prompt", default="", help="text to continue; '-' reads it from stdin")
    max_new_tokens: int = field("generate/max_new_tokens", default=200, help="most tokens generated per sample")
    temperature: float = field("generate/temperature", default=1.0, help="softmax temperature (0 = greedy)")
    top_k: int = field("generate/top_k", default=0, help="sample among the k most likely tokens (0 = off)")
    top_p: float = field("generate/top_p", default=0.9, help="nucleus sampling probability mass (1 = off)")
    seed: int = field("generate/seed", default=0, help="random seed; the same seed gives the same text")
    samples: int = field("generate/samples", default=1, help="independent samples of the prompt (one batch)")
    step: int = field(
        "generate/step", default=-1, help="checkpoint step to load, as generate/run=NAME@STEP (-1: the latest)"
    )
    stop_at_eot: bool = field("generate/stop_at_eot", default=True, help="end a sample at the end-of-text token")
    start_with_eot: bool = field(
        "generate/start_with_eot", default=True, help="put end-of-text before the prompt, where documents begin"
    )
    tokenizer: str = field("generate/tokenizer", default="", help="tokenizer spec (empty: the run's own)")
    chat: bool = field(
        "generate/chat", default=False, help="send the prompt as a user message through the run's chat template"
    )


class Generate(Job):
    """Load a run's checkpoint and print samples continuing a prompt (KV cache, jitted decoding)."""

    CONFIG = GenerateConfig

    def run(self) -> None:
        from theseus.model.generation.sampling import SamplingParams
        from theseus.model.generation.text import complete
        from theseus.model.loading.run import load_run

        args: GenerateConfig = self.args
        if args.samples < 1:
            raise ConfigError(f"generate/samples must be at least 1, got {args.samples}")
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
        ref = RunRef.parse(args.run, self.context.root, key="generate/run").at(args.step, step_key="generate/step")
        run = load_run(self.context.root, ref, tokenizer=args.tokenizer or None)

        def note(text: str) -> None:
            click.echo(text, err=True)

        start_with_eot = args.start_with_eot
        if args.chat:
            from theseus.model.loading.chat import chat_prompt

            prompt = chat_prompt(run, prompt)
            start_with_eot = False
            note(f"chat prompt {prompt!r}")

        note(
            f"{run.name} step {run.step}: {type(run.model).__name__} {run.parameters / 1e6:.2f}M parameters, "
            f"context {run.context_length}, tokenizer {run.tokenizer.spec}; {sampling.describe()}, seed {args.seed}"
        )
        samples = complete(
            run,
            [prompt] * args.samples,
            args.max_new_tokens,
            sampling=sampling,
            seed=args.seed,
            start_with_eot=start_with_eot,
            stop_at_eot=args.stop_at_eot,
            note=note,
        )
        for index, sample in enumerate(samples):
            if args.samples > 1:
                click.echo(f"--- sample {index + 1} ---")
            click.echo(sample.text)
            end = "end-of-text" if sample.stopped else "max_new_tokens"
            note(f"[{sample.tokens} tokens, stopped at {end}]")
