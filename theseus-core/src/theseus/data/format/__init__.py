"""The prepared-data format: token shards plus a JSON header under ``<root>/data/<name>/``.

Layout of a prepared dataset folder::

    header.json        written last: its presence marks the folder complete
    train.bin          every train token, documents back to back, each followed by end-of-text
    train.idx          int64 [documents, 3]: (start, length, prompt_length) of each document
    val.bin, val.idx   the same for the validation split
    train.mask, ...    uint8 per token, 1 = learned as a target (only data with masks: chat)
    tokenizer.json     a copy of the tokenizer file, for file-based tokenizers

Tokens are ``uint16`` when the vocabulary fits (``vocab_size <= 65536``), else ``uint32``. A document's
``length`` counts its end-of-text token; ``prompt_length`` is the number of leading tokens that are
a prompt (not learned in the ``"padded"`` and ``"packed"`` styles), 0 for plain text. Data whose
learned tokens are not one suffix per document (chat: only assistant turns are learned) also
stores a per-token mask (``masked`` in the header).

The format is split by concern: ``header`` (folder names, the token dtype, ``Header``), ``reader``
(``Prepared``) and ``writer`` (``PreparedWriter``, atomic and resumable, and ``preparation_lock``).
This package exports the public names of all three.
"""

from theseus.data.format.header import (
    FORMAT,
    FORMAT_VERSION,
    HEADER_FILE,
    STYLES,
    Header,
    SplitInfo,
    data_folder,
    prepare_command,
    read_header,
    token_dtype,
)
from theseus.data.format.reader import Prepared
from theseus.data.format.writer import (
    MANIFEST_FILE,
    PreparedWriter,
    preparation_lock,
    remove_stale_staging,
    resumable_staging,
)

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "HEADER_FILE",
    "MANIFEST_FILE",
    "STYLES",
    "Header",
    "Prepared",
    "PreparedWriter",
    "SplitInfo",
    "data_folder",
    "preparation_lock",
    "prepare_command",
    "read_header",
    "remove_stale_staging",
    "resumable_staging",
    "token_dtype",
]
