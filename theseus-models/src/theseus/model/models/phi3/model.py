"""``Phi3``: Llama's blocks (RMSNorm, SwiGLU, RoPE, no biases, untied head) in Phi-3's shapes."""

from __future__ import annotations

from typing import ClassVar

from theseus.model.models.llama.model import Llama
from theseus.model.stack.architecture import Preset

PHI3_PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        n_layers=4,
        n_heads=4,
        n_embd=128,
        mlp_ratio=8.0 / 3.0,
        ffn_multiple=32,
        description="~0.90M parameters at vocab 257 (384 padded rows); tests and demos",
    ),
    # microsoft/Phi-3-mini-4k-instruct's config.json: 32 layers, 32 heads of 96 (no grouping), 3072
    # wide, intermediate 8192, untied head; 3.821B parameters at vocab 32064 (architecture/vocab_multiple=1;
    # the default multiple of 128 pads the embedding and head to 32128 rows, 0.39M more).
    "phi-3-mini": Preset(
        n_layers=32,
        n_heads=32,
        n_embd=3072,
        mlp_ratio=8192 / 3072,
        description="Phi-3-mini's shape: 3.821B parameters at vocab 32064 (vocab_multiple=1)",
    ),
}


class Phi3(Llama):
    """Phi-3: :class:`Llama`'s pre-norm blocks, with no grouping in the released shapes. The
    checkpoints fuse the query, key and value projections (``qkv_proj``) and the gate and up
    projections (``gate_up_proj``); ``hf/import`` splits them into theseus' separate projections and
    ``hf/export`` fuses them back. The keys shared with Llama keep Llama's defaults; Phi-3-mini-4k
    sets ``architecture/sliding_window=2047`` and ``architecture/block_size=4096`` (``hf/import``
    reads both from ``config.json``: each token sees itself and the 2046 before it); the 128k releases'
    LongRoPE is ``architecture/rope_scaling=longrope`` (see :class:`Llama`).

    Presets (``architecture/preset``): ``tiny`` (4 layers, 4 heads of 32, 128 wide, d_ff 352) and
    ``phi-3-mini`` (the published Phi-3-mini shape; 3.821B parameters at
    ``architecture/vocab_size=32064`` with ``architecture/vocab_multiple=1``). ``hf/import`` of a
    ``model_type: phi3`` checkpoint builds this model; see :class:`Llama` for the other keys.
    """

    PRESETS: ClassVar[dict[str, Preset]] = PHI3_PRESETS
    FAMILY: ClassVar[str] = "Phi3"
