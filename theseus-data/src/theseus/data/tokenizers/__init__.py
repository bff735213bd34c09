"""Tokenizers beyond the byte-level default of ``theseus.data.tokenizer``.

Registered components: ``tokenizer/byte`` (core), ``tokenizer/hf`` (:class:`HFTokenizer`, a local
``tokenizer.json``), ``tokenizer/tiktoken`` (:class:`TiktokenTokenizer`, optional extra).
"""

from theseus.data.tokenizer import EOT_TEXT, ByteTokenizer, Tokenizer, load_tokenizer
from theseus.data.tokenizers.bpe import train_bpe
from theseus.data.tokenizers.huggingface import HFTokenizer
from theseus.data.tokenizers.tiktoken_tokenizer import TiktokenTokenizer

__all__ = ["EOT_TEXT", "ByteTokenizer", "HFTokenizer", "TiktokenTokenizer", "Tokenizer", "load_tokenizer", "train_bpe"]
