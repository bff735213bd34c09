"""Rollout speed: theseus's KV-cache decoder against transformers' ``generate`` on the same weights,
side by side in one run, and the rollout's share of a GRPO step.

    python benchmarks/rollout.py                   # GPT-2 shape 4 x 128, 64 prompts x 128 new tokens
    python benchmarks/rollout.py --family llama    # Llama shape (RoPE, RMSNorm, SwiGLU, GQA 4/2)
    python benchmarks/rollout.py --no-grpo --rounds 7
    python benchmarks/rollout.py --grpo-only       # only the GRPO run's rollout share
    python benchmarks/rollout.py --grpo-only --async-rollouts   # and its step time with rollouts made ahead
    python benchmarks/rollout.py --quick           # small sizes, a smoke check

One random transformers model (byte vocabulary, 257 ids) is saved with ``save_pretrained`` and read
through theseus's importer (``hf/import``'s ``prepare`` + ``read_params``), so both sides sample from
the same weights (checked: the largest difference of their logits on the prompts is printed). Each
round times, in rotated order and after one untimed call each, theseus's
``theseus.model.generation.decode.generate_tokens`` (what the GRPO trainer's rollouts call: one
jitted program, prefill and a ``lax.while_loop`` over tokens) and ``model.generate`` of transformers
(torch CPU eager, ``use_cache=True``, prompts left-padded with an attention mask) with the same
sampling (``do_sample=True``, temperature, top-p, no top-k). No end-of-text id is set on either side,
so every row gets exactly the new tokens asked for. transformers runs once with torch's default
threads and once with one (torch's threads slow down sharply when other processes share the cores);
theseus is compared with the faster of the two. Tokens/s count new tokens; the ratio is the median of
per-round ratios. theseus's first call (trace, compile, one run) is reported apart:
compile = first call - a steady call.

The GRPO share: ``theseus run train/grpo environment=arithmetic`` (``model=llama`` with
``--family llama``) in a subprocess with the same model shape and rollout size (8 prompts x 8
completions of up to 128 tokens), a few updates; from its ``metrics.jsonl``, the trainer's own time
split: ``rollout_seconds`` and ``update_seconds`` (the update before the rollout), from the third
step on, so that neither the decoder's nor the update's compile is counted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, load_average, markdown_table, percent, rotated_rounds, start_like_theseus_run

GOAL = 1.0  # theseus ÷ transformers tokens/s (issue 41)
VOCAB = 257  # the byte tokenizer's ids (end-of-text included)


@dataclasses.dataclass(frozen=True)
class Setting:
    """What one run measures."""

    family: str = "gpt2"
    layers: int = 4
    width: int = 128
    heads: int = 4
    prompts: int = 64
    new_tokens: int = 128
    shortest: int = 8  # prompt lengths are drawn from [shortest, longest]
    longest: int = 32
    temperature: float = 1.0
    top_p: float = 0.95
    rounds: int = 5
    grpo_steps: int = 6  # 0: no GRPO run

    @property
    def shape(self) -> str:
        return f"{self.family} {self.layers}x{self.width}, {self.prompts} prompts x {self.new_tokens} new tokens"


QUICK = Setting(layers=2, width=64, prompts=16, new_tokens=32, rounds=2, grpo_steps=4)


def random_checkpoint(folder: Path, setting: Setting) -> Any:
    """A randomly initialised transformers model of ``setting``'s shape, saved in ``folder``; returned in eval mode."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    positions = setting.longest + setting.new_tokens
    if setting.family == "gpt2":
        config: Any = GPT2Config(
            vocab_size=VOCAB,
            n_positions=positions,
            n_embd=setting.width,
            n_layer=setting.layers,
            n_head=setting.heads,
            bos_token_id=None,
            eos_token_id=None,
        )
        model: Any = GPT2LMHeadModel(config)
    elif setting.family == "llama":
        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=setting.width,
            intermediate_size=3 * setting.width,
            num_hidden_layers=setting.layers,
            num_attention_heads=setting.heads,
            num_key_value_heads=max(1, setting.heads // 2),
            max_position_embeddings=positions,
            bos_token_id=None,
            eos_token_id=None,
            tie_word_embeddings=False,
        )
        model = LlamaForCausalLM(config)
    else:
        raise SystemExit(f"--family must be gpt2 or llama, not {setting.family!r}")
    model.save_pretrained(folder)
    return model.eval()


def make_prompts(setting: Setting, seed: int = 0) -> list[list[int]]:
    """Byte-token prompts of random lengths in ``[shortest, longest]``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = rng.integers(setting.shortest, setting.longest + 1, setting.prompts)
    return [rng.integers(0, 256, int(n)).tolist() for n in lengths]


def logit_difference(model: Any, params: Any, hf: Any, prompts: list[list[int]]) -> float:
    """The largest |theseus - transformers| logit on a few prompts cut to one length (no padding)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    length = min(len(p) for p in prompts)
    ids = np.asarray([p[:length] for p in prompts[:4]], np.int32)
    forward = jax.jit(lambda p, x: model.apply({"params": p}, x, deterministic=True)[0])
    ours = np.asarray(forward(params, jnp.asarray(ids)))
    with torch.inference_mode():
        theirs = hf(torch.from_numpy(ids.astype(np.int64))).logits.float().numpy()
    return float(np.max(np.abs(ours[..., :VOCAB] - theirs)))


def transformers_name(threads: int) -> str:
    return f"transformers, {threads} thread{'s' if threads > 1 else ''}"


def measure_generation(setting: Setting, log: Any = print) -> dict[str, Any]:
    """Seconds per rollout of both decoders (per round), theseus's first call and the logit check."""
    import torch

    from theseus.model.generation.decode import generate_tokens, left_pad
    from theseus.model.generation.sampling import SamplingParams
    from theseus.model.huggingface.importer import prepare, read_params

    prompts = make_prompts(setting)
    new = setting.new_tokens
    sampling = SamplingParams(temperature=setting.temperature, top_p=setting.top_p)
    with tempfile.TemporaryDirectory(prefix="theseus-rollout-") as tmp:
        hf = random_checkpoint(Path(tmp), setting)
        prepared = prepare(Path(tmp))
        params = read_params(prepared)
    model = prepared.model
    difference = logit_difference(model, params, hf, prompts)
    ids, mask = left_pad(prompts)
    hf_ids, hf_mask = torch.from_numpy(ids.astype("int64")), torch.from_numpy(mask.astype("int64"))

    def theseus_rollout() -> None:
        done = generate_tokens(model, params, prompts, new, sampling=sampling, seed=0)
        assert all(len(c.tokens) == new for c in done)

    def transformers_rollout(threads: int) -> None:
        torch.set_num_threads(threads)
        with torch.inference_mode():
            out = hf.generate(
                hf_ids,
                attention_mask=hf_mask,
                max_new_tokens=new,
                do_sample=True,
                temperature=setting.temperature,
                top_p=setting.top_p,
                top_k=0,
                use_cache=True,
                pad_token_id=0,
            )
        assert tuple(out.shape) == (len(prompts), ids.shape[1] + new), out.shape

    began = time.perf_counter()
    theseus_rollout()
    first = time.perf_counter() - began
    log(f"[rollout] theseus first call (trace + compile + run): {first:.2f} s")
    threads = torch.get_num_threads()
    sides: dict[str, tuple[Any, tuple[Any, ...]]] = {"theseus": (theseus_rollout, ())}
    for count in sorted({threads, 1}, reverse=True):
        sides[transformers_name(count)] = (transformers_rollout, (count,))
    seconds = rotated_rounds(sides, setting.rounds)
    torch.set_num_threads(threads)
    return {
        "first_call": first,
        "seconds": seconds,
        "tokens": len(prompts) * new,
        "logit_difference": difference,
        "torch": str(torch.__version__),
    }


def grpo_job(setting: Setting) -> str:
    return "train/grpo" if setting.family == "gpt2" else "train/grpo model=llama"


def grpo_overrides(setting: Setting, name: str, extra: Sequence[str] = ()) -> list[str]:
    """The GRPO job's settings: the arithmetic environment at ``setting``'s shape and rollout size, then ``extra``."""
    group = 8
    llama = (
        ["model=llama", f"architecture/n_kv_heads={max(1, setting.heads // 2)}"] if setting.family == "llama" else []
    )
    return [
        "environment=arithmetic",
        *llama,
        f"architecture/n_layers={setting.layers}",
        f"architecture/n_embd={setting.width}",
        f"architecture/n_heads={setting.heads}",
        f"architecture/vocab_size={VOCAB}",
        "architecture/block_size=256",
        "training/sequence_length=256",
        f"training/batch_size={max(group, setting.prompts // group * group)}",
        f"rl/group_size={group}",
        f"rl/max_new_tokens={setting.new_tokens}",
        f"rl/temperature={setting.temperature}",
        f"rl/top_p={setting.top_p}",
        f"training/steps={setting.grpo_steps}",
        "training/log_interval=1",
        "training/eval_batches=0",
        "training/progress=false",
        "training/peak_flops=1e12",
        f"run/name={name}",
        *extra,
    ]


#: Steps before this one hold a compile: the decoder's in step 1's rollout, the update's in step 2's
#: ``update_seconds`` (the update of step 1).
FIRST_STEADY_STEP = 3


def rollout_share(rows: list[dict[str, Any]]) -> dict[str, float]:
    """From a GRPO run's train rows: the mean rollout and update seconds of the steps from
    :data:`FIRST_STEADY_STEP` on, and the rollout's share of their sum."""
    rows = sorted(rows, key=lambda row: row["step"])
    steady = [row for row in rows if row["step"] >= FIRST_STEADY_STEP]
    if not steady:
        raise ValueError(
            f"the GRPO run logged no step from {FIRST_STEADY_STEP} on; give it {FIRST_STEADY_STEP} or more"
        )
    rollout = statistics.fmean(float(row["rollout_seconds"]) for row in steady)
    update = statistics.fmean(float(row["update_seconds"]) for row in steady)
    waited = statistics.fmean(float(row.get("rollout_wait_seconds", row["rollout_seconds"])) for row in steady)
    return {
        "step_s": waited + update,  # what a step takes: the wait for its rollouts, then its update
        "rollout_s": rollout,
        "update_s": update,
        "share": rollout / (rollout + update),
        "steps": float(len(steady)),
        "first_rollout_s": float(rows[0]["rollout_seconds"]),
        "rollout_tokens_per_s": statistics.fmean(float(row["rollout_tokens_per_s"]) for row in steady),
    }


#: ``--async-rollouts``: the GRPO run again with its rollouts made ahead, a step behind.
AHEAD = ("rl/async_rollouts=true", "rl/max_staleness=1")


def measure_grpo(setting: Setting, log: Any = print, extra: Sequence[str] = ()) -> dict[str, float]:
    """Run ``train/grpo`` for ``setting.grpo_steps`` updates in a fresh ``theseus run`` process."""
    from benchmarks.first_step import _env, theseus_command

    with tempfile.TemporaryDirectory(prefix="theseus-rollout-grpo-") as tmp:
        overrides = grpo_overrides(setting, "share", extra)
        command = [*theseus_command(), "run", "train/grpo", *overrides, "--root", tmp]
        log(f"[rollout] {' '.join(command[1:])}")
        done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=3600, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the GRPO run failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        lines = (Path(tmp) / "runs" / "share" / "metrics.jsonl").read_text().splitlines()
    rows = [row for row in map(json.loads, lines) if row.get("split") == "train"]
    return rollout_share(rows)


def rows_of(
    setting: Setting,
    generation: dict[str, Any] | None,
    grpo: dict[str, float] | None,
    ahead: dict[str, float] | None = None,
) -> list[Row]:
    """The table's rows."""
    rows = [] if generation is None else generation_rows(setting, generation)
    if grpo is not None and ahead is not None:
        for label, measured in (("synchronous", grpo), ("rollouts made ahead, a step behind", ahead)):
            waited, update = measured["step_s"] - measured["update_s"], measured["update_s"]
            note = f"wait for rollouts {waited:.3f} s + update {update:.3f} s"
            rows.append(Row(f"GRPO step, {label}", measured["step_s"], "s", note=note, fmt="{:.3f}"))
        rows.append(
            Row(
                "GRPO step: made ahead ÷ synchronous",
                ahead["step_s"] / grpo["step_s"],
                "x",
                note=f"{' '.join(AHEAD)}; means of the steps from step {FIRST_STEADY_STEP}",
                fmt="{:.2f}",
            )
        )
    if grpo is not None:
        rows.append(
            percent(
                "GRPO step: rollout share (rollout ÷ rollout + update)",
                grpo["share"],
                note=f"{grpo_job(setting)}, arithmetic, {setting.prompts} completions of up to {setting.new_tokens} "
                f"tokens: rollout {grpo['rollout_s']:.2f} s + update {grpo['update_s']:.2f} s (means of "
                f"{int(grpo['steps'])} steps from step {FIRST_STEADY_STEP}; rollout_tokens_per_s "
                f"{grpo['rollout_tokens_per_s']:,.0f}; first rollout with compile {grpo['first_rollout_s']:.2f} s)",
            )
        )
    return rows


def generation_rows(setting: Setting, generation: dict[str, Any]) -> list[Row]:
    """The rows of :func:`measure_generation`'s result."""
    seconds = generation["seconds"]
    ours, tokens = seconds["theseus"], generation["tokens"]
    steady = statistics.median(ours)
    baseline = min((name for name in seconds if name != "theseus"), key=lambda name: statistics.median(seconds[name]))
    theirs = seconds[baseline]
    ratios = [t / o for o, t in zip(ours, theirs, strict=True)]  # tokens/s ratio = inverse time ratio
    sampling = f"temperature {setting.temperature:g}, top-p {setting.top_p:g}"
    rows = [
        Row(
            f"theseus generate_tokens ({setting.shape})",
            tokens / steady,
            "tok/s",
            note=f"median of {setting.rounds} rounds, {steady:.3f} s per rollout; {sampling}",
            fmt="{:,.0f}",
        )
    ]
    for name, times in seconds.items():
        if name != "theseus":
            rows.append(
                Row(
                    f"{name} generate (same weights and prompts)",
                    tokens / statistics.median(times),
                    "tok/s",
                    note=f"torch {generation['torch']} CPU eager, use_cache, left-padded; "
                    f"{statistics.median(times):.3f} s per rollout",
                    fmt="{:,.0f}",
                )
            )
    rows += [
        Row(
            "theseus ÷ transformers tokens/s",
            statistics.median(ratios),
            "x",
            GOAL,
            "min",
            f"against the faster transformers setting ({baseline}); median of per-round ratios; "
            f"best rounds {min(theirs) / min(ours):.2f}x",
            "{:.2f}",
        ),
        Row(
            "theseus first call (trace + compile + one rollout)",
            generation["first_call"],
            "s",
            note=f"compile ≈ {generation['first_call'] - steady:.2f} s (first call - steady call)",
            fmt="{:.2f}",
        ),
        Row(
            "Same weights: max |logit difference|",
            generation["logit_difference"],
            note="theseus (imported) vs transformers, float32, 4 prompts",
            fmt="{:.1e}",
        ),
    ]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke check")
    parser.add_argument("--family", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--prompts", type=int, help="rows per rollout (default 64)")
    parser.add_argument("--new-tokens", type=int, help="new tokens per row (default 128)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--rounds", type=int, help="timed rounds (default 5)")
    parser.add_argument("--no-grpo", action="store_true", help="skip the GRPO run (the rollout share)")
    parser.add_argument("--grpo-only", action="store_true", help="only the GRPO run (the rollout share)")
    parser.add_argument(
        "--async-rollouts", action="store_true", help="also the GRPO run with its rollouts made ahead (step times)"
    )
    args = parser.parse_args(argv)
    setting = QUICK if args.quick else Setting()
    changes: dict[str, Any] = {"family": args.family, "temperature": args.temperature, "top_p": args.top_p}
    for name in ("prompts", "new_tokens", "rounds"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.no_grpo:
        changes["grpo_steps"] = 0
    setting = dataclasses.replace(setting, **changes)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    load_before = load_average()
    generation = None if args.grpo_only else measure_generation(setting, log)
    grpo = measure_grpo(setting, log) if setting.grpo_steps else None
    ahead = measure_grpo(setting, log, AHEAD) if setting.grpo_steps and args.async_rollouts else None
    load = f"load average {load_before:.1f} -> {load_average():.1f}" if load_before is not None else ""
    rows = rows_of(setting, generation, grpo, ahead)
    print(markdown_table(rows, title="Rollout: theseus decoder vs transformers", extra=load))
    return 0


if __name__ == "__main__":
    start_like_theseus_run()
    sys.exit(main())
