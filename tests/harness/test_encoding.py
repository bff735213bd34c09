"""Requests become the tokens lm-eval's Hugging Face model makes of them, with and without a BOS.

lm-eval's ``HFLM`` is built around the tokenizer alone (no model): its request methods hand their
token lists to ``_loglikelihood_tokens``, which is replaced here to record them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness.conftest import CHOICES, TEXTS
from tests.huggingface.conftest import make_tokenizer
from theseus.model.harness.encoding import Codec

PAIRS = [(row["question"], choice) for row in CHOICES for choice in row["choices"]] + [
    ("Fire is\n\t ", "hot"),
    ("", "<s>cats"),  # the continuation starts with the prefix token itself
    ("<s>already", " begun"),  # a text that starts with BOS gets no second one
]
MAX_LENGTH = 16


class Request:
    def __init__(self, *args: Any) -> None:
        self.args = args


def lm_eval_hf(folder: Path) -> Any:
    """lm-eval's HFLM over the tokenizer in ``folder``, recording what it would score."""
    from lm_eval.api.model import CacheHook
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    lm = HFLM.__new__(HFLM)
    from lm_eval.models.utils import configure_pad_token

    tokenizer = configure_pad_token(AutoTokenizer.from_pretrained(folder))
    values = {"tokenizer": tokenizer, "add_bos_token": None, "custom_prefix_token_id": None}
    values.update({"backend": "causal", "_max_length": MAX_LENGTH, "enable_thinking": None, "batch_size_per_gpu": 64})
    values.update({"cache_hook": CacheHook(None), "_rank": 0, "_world_size": 1, "recorded": []})
    lm.__dict__.update(values)

    def record(requests: list[Any], **_: Any) -> list[tuple[float, bool]]:
        lm.recorded.extend((list(context), list(continuation)) for _, context, continuation in requests)
        return [(0.0, True)] * len(requests)

    lm._loglikelihood_tokens = record
    return lm


@pytest.mark.parametrize("bos", [False, True], ids=["gpt2-like", "llama-like"])
def test_pairs_windows_and_prompts_are_tokenized_as_lm_eval_does(tmp_path: Path, bos: bool) -> None:
    from theseus.data.tokenizers.huggingface import HFTokenizer

    make_tokenizer(tmp_path, bos=bos)
    hf = lm_eval_hf(tmp_path)
    codec = Codec.create(HFTokenizer(tmp_path / "tokenizer.json"), bos_id=257 if bos else None)
    assert codec.prefix_id == (257 if bos else 256) == hf.prefix_token_id

    hf.loglikelihood([Request(*pair) for pair in PAIRS], disable_tqdm=True)
    assert [codec.pair(*pair) for pair in PAIRS] == hf.recorded

    hf.recorded.clear()
    texts = [row["text"] for row in TEXTS]
    hf.loglikelihood_rolling([Request(text) for text in texts], disable_tqdm=True)
    windows = [window for text in texts for window in codec.rolling(text, MAX_LENGTH)]
    assert windows == hf.recorded and len(windows) > len(texts)

    contexts = ["def f(x):", "A context longer than the room the generation leaves", "<s>x"]
    ids, mask = hf.tok_batch_encode(contexts[:2], left_truncate_len=10)
    prompts = [
        [t for t, real in zip(row, keep, strict=True) if real]
        for row, keep in zip(ids.tolist(), mask.tolist(), strict=True)
    ]
    assert [codec.encode(context)[-10:] for context in contexts[:2]] == prompts
    assert codec.encode(contexts[2]) == hf.tok_encode(contexts[2])
