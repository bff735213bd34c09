"""Text in, text out: encode prompts with a run's tokenizer, sample, decode."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from theseus.model.generation.decode import generate_tokens
from theseus.model.generation.sampling import SamplingParams
from theseus.model.loading.run import LoadedRun


@dataclass(frozen=True)
class Sample:
    """One generated text: ``prompt`` + ``completion`` (decoded together), whether it ended with
    end-of-text, and the number of generated tokens."""

    prompt: str
    completion: str
    stopped: bool
    tokens: int

    @property
    def text(self) -> str:
        return self.prompt + self.completion


def complete(
    run: LoadedRun,
    prompts: Sequence[str],
    max_new_tokens: int,
    *,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    start_with_eot: bool = True,
    stop_at_eot: bool = True,
    note: Callable[[str], None] | None = None,
) -> list[Sample]:
    """Continue each text prompt (one batch) with up to ``max_new_tokens`` tokens.

    ``start_with_eot`` puts the end-of-text token before every prompt, where documents begin in
    packed training data (an empty prompt then starts a new document), or the beginning-of-sequence
    token of a run imported from a checkpoint whose tokenizer adds one. Prompts longer than the
    model's context keep their end; ``max_new_tokens`` is lowered to what the context leaves
    (``note`` is told about either); the context is what the run trained on (``run.context_length``).
    """
    tokenizer = run.tokenizer
    eot = run.eot_id
    block = run.context_length
    encoded: list[list[int]] = []
    start = run.bos_id if run.bos_id is not None else eot
    prefix = [start] if start_with_eot and start is not None else []
    for text in prompts:
        ids = prefix + list(tokenizer.encode(text))
        encoded.append(ids if ids else [eot if eot is not None else 0])
    longest = max(len(ids) for ids in encoded)
    keep = max(1, block // 2)
    if longest > keep and longest + max_new_tokens - 1 > block:
        encoded = [ids[-keep:] for ids in encoded]
        if note:
            note(f"prompt longer than {keep} tokens: only its last {keep} tokens are used as context")
        longest = max(len(ids) for ids in encoded)
    room = block - longest + 1
    if max_new_tokens > room:
        if note:
            note(f"max_new_tokens lowered from {max_new_tokens} to {room}: the model's context is {block} tokens")
        max_new_tokens = room
    completions = generate_tokens(
        run.model,
        run.params,
        encoded,
        max_new_tokens,
        sampling=sampling,
        seed=seed,
        eot_id=eot if stop_at_eot else None,
    )
    samples = []
    for ids, done in zip(encoded, completions, strict=True):
        context = ids[len(prefix) :] if ids[: len(prefix)] == prefix else ids
        shown_prompt = tokenizer.decode(context)
        full = tokenizer.decode(context + done.tokens)
        completion = full[len(shown_prompt) :] if full.startswith(shown_prompt) else full
        samples.append(Sample(shown_prompt, completion, done.stopped, len(done.tokens)))
    return samples
