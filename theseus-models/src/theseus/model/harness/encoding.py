"""Request text to tokens, the way lm-eval's Hugging Face model (``HFLM``) tokenizes it.

- A *context/continuation pair* moves the context's trailing whitespace to the continuation,
  encodes the context and the whole text, and takes the continuation as the whole text's tokens
  after the context's (so a merge across the boundary counts to the continuation). An empty
  context becomes the prefix token, unless the continuation already starts with it.
- A *text* for ``loglikelihood_rolling`` is split into windows of at most ``max_length``
  predicted tokens, the first one conditioned on the prefix token (lm-eval's
  ``get_rolling_token_windows`` and ``make_disjoint_window``).
- The *prefix token* is the beginning-of-sequence id of a run whose tokenizer starts texts with
  one (Llama's ``<s>``), else end-of-text; encoding a text adds that beginning-of-sequence id as
  the tokenizer would, except when the text already starts with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from theseus.data.tokenizers.base import Tokenizer

#: One scoring request: the context's tokens and the continuation's tokens (scored).
Pair = tuple[list[int], list[int]]


@dataclass(frozen=True)
class Codec:
    """A tokenizer with the special ids lm-eval's requests need."""

    tokenizer: Tokenizer
    #: The id conditioning an empty context and the first rolling window (BOS, else end-of-text).
    prefix_id: int
    #: The id the tokenizer puts before every text (None: it adds nothing).
    bos_id: int | None = None

    @classmethod
    def create(cls, tokenizer: Tokenizer, bos_id: int | None = None, eot_id: int | None = None) -> Codec:
        """The codec of a run: prefix ``bos_id`` when the tokenizer adds one, else end-of-text."""
        eot = int(tokenizer.eot_id) if eot_id is None else int(eot_id)
        return cls(tokenizer, bos_id if bos_id is not None else eot, bos_id)

    @property
    def prefix_text(self) -> str:
        return self.tokenizer.decode([self.prefix_id])

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of ``text``; with ``special`` the beginning-of-sequence id first (when the
        tokenizer adds one and the text does not already start with it)."""
        ids = list(self.tokenizer.encode(text))
        if special and self.bos_id is not None and not text.startswith(self.prefix_text):
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def pair(self, context: str, continuation: str) -> Pair:
        """The (context, continuation) tokens of a ``loglikelihood`` request."""
        if not context:
            tokens = self.encode(continuation, special=False)
            if tokens and tokens[0] == self.prefix_id:
                return tokens[:1], tokens[1:]
            return [self.prefix_id], tokens
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.encode(context + continuation)
        before = self.encode(context)
        return before, whole[len(before) :]

    def rolling(self, text: str, max_length: int) -> list[Pair]:
        """The disjoint (context, continuation) windows that score every token of ``text`` once."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        windows = get_rolling_token_windows(
            token_list=self.encode(text), prefix_token=self.prefix_id, max_seq_len=max_length, context_len=1
        )
        return [make_disjoint_window(window) for window in windows]


__all__ = ["Codec", "Pair"]
