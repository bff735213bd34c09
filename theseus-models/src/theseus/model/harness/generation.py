"""``generate_until`` requests: KV-cache generation of one group of requests with the same settings.

Contexts keep their last ``max_length - max_gen_toks`` tokens; batches are filled to ``batch_size``
rows and left-padded to a bucketed width (one compile per width); each generated text is cut at the
first occurrence of each stop string (:mod:`.settings` reads and checks the settings).
"""

from __future__ import annotations

from collections.abc import Sequence

from theseus.errors import ConfigError
from theseus.model.harness.compute import Compute, Generation
from theseus.model.harness.encoding import Codec
from theseus.model.harness.scoring import bucket
from theseus.model.harness.settings import Settings, cut


def generate(
    compute: Compute,
    codec: Codec,
    contexts: Sequence[str],
    chosen: Settings,
    *,
    batch_size: int,
    max_length: int,
    seed: int = 0,
    eot_id: int | None = None,
) -> list[str]:
    """The generated text of each context (one group of requests with the same settings)."""
    room = max_length - chosen.max_gen_toks
    if room < 1:
        raise ConfigError(
            f"max_gen_toks={chosen.max_gen_toks} leaves no room for a context in the model's {max_length} tokens; "
            "lower the task's generation_kwargs.max_gen_toks"
        )
    prompts = []
    for context in contexts:
        ids = codec.encode(context)[-room:]
        prompts.append(ids or [codec.prefix_id])
    ordered = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), contexts[i]))
    texts = [""] * len(prompts)
    for number, start in enumerate(range(0, len(ordered), batch_size)):
        chunk = ordered[start : start + batch_size]
        rows = [prompts[i] for i in chunk]
        rows += [rows[0]] * (batch_size - len(rows))  # a full batch: one compile per width
        width = bucket(max(len(r) for r in rows), room)
        request = Generation(rows, chosen.max_gen_toks, chosen.sampling(), seed + number, eot_id, width)
        for index, tokens in zip(chunk, compute.generate(request), strict=False):
            texts[index] = cut(codec.decode(tokens), chosen.until)
    return texts


__all__ = ["generate"]
