"""Text generation from trained runs: temperature / top-k / top-p sampling with the KV cache.

    from theseus.model.generation import SamplingParams, complete, generate_tokens, load_run

    run = load_run(root, "demo-gpt")                       # model + checkpoint params + tokenizer
    samples = complete(run, ["def ", "class "], 200, sampling=SamplingParams(0.8, top_p=0.95), seed=0)
    print(samples[0].text)

``generate_tokens(model, params, token_prompts, max_new_tokens, sampling=..., seed=..., eot_id=...)``
works on any GPT / Llama parameters; the ``generate`` job wraps ``load_run`` and ``complete``.
"""

from theseus.model.generation.decode import Completion, generate_tokens, left_pad
from theseus.model.generation.sampling import SamplingParams, filter_top_k, filter_top_p, sample_logits
from theseus.model.generation.text import Sample, complete
from theseus.model.loading.run import LoadedRun, available_runs, load_run

__all__ = [
    "Completion",
    "LoadedRun",
    "Sample",
    "SamplingParams",
    "available_runs",
    "complete",
    "filter_top_k",
    "filter_top_p",
    "generate_tokens",
    "left_pad",
    "load_run",
    "sample_logits",
]
