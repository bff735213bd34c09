"""Tokenizers: the protocol and specs, the byte-level default, Hugging Face and tiktoken tokenizers, BPE training.

This package is shared by two distributions. theseus-core ships the protocol (``.base``), the byte
tokenizer (``.byte``) and tokenizer specs with ``load_tokenizer`` (``.spec``); theseus-data ships ``.huggingface``,
``.tiktoken_tokenizer``, ``.bpe`` and this file, the only ``__init__.py`` of the package, which makes
every public name importable from the package itself. A name is imported from its module on first
use, so importing one module does not import the others. With theseus-core alone the package is a
plain namespace: import from its modules (``theseus.data.tokenizers.byte``).

Registered components: ``tokenizer/byte`` (:class:`ByteTokenizer`, theseus-core), ``tokenizer/hf``
(:class:`HFTokenizer`, a local ``tokenizer.json``), ``tokenizer/tiktoken`` (:class:`TiktokenTokenizer`,
optional extra).
"""

from __future__ import annotations

from pkgutil import extend_path
from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

# theseus-core's modules of this package may lie in another folder (editable installs): look there too.
__path__ = extend_path(__path__, __name__)

#: Each public name and the module of this package that defines it.
_HOMES = {
    "EOT_TEXT": "base",
    "Tokenizer": "base",
    "load_tokenizer": "spec",
    "ByteTokenizer": "byte",
    "HFTokenizer": "huggingface",
    "TiktokenTokenizer": "tiktoken_tokenizer",
    "train_bpe": "bpe",
}

if TYPE_CHECKING:
    from theseus.data.tokenizers.base import EOT_TEXT, Tokenizer
    from theseus.data.tokenizers.bpe import train_bpe
    from theseus.data.tokenizers.byte import ByteTokenizer
    from theseus.data.tokenizers.huggingface import HFTokenizer
    from theseus.data.tokenizers.spec import load_tokenizer
    from theseus.data.tokenizers.tiktoken_tokenizer import TiktokenTokenizer


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = ["EOT_TEXT", "ByteTokenizer", "HFTokenizer", "TiktokenTokenizer", "Tokenizer", "load_tokenizer", "train_bpe"]
