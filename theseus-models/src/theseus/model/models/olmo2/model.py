"""``OLMo2``: Llama's projections and SwiGLU MLP, with each branch normalised after it (before the
residual sum) and the query and key projections RMS-normalised as a whole before RoPE."""

from __future__ import annotations

from typing import ClassVar

from theseus.model.models.llama.model import Llama
from theseus.model.stack.architecture import Preset

OLMO2_PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        n_layers=4,
        n_heads=4,
        n_embd=128,
        description="~0.9M parameters at vocab 257; tests and demos",
    ),
    # allenai/OLMo-2-0425-1B's config.json: 16 layers, 16 heads of 128 (no grouping), 2048 wide,
    # intermediate 8192, untied head; 1.485B parameters at vocab 100352.
    "olmo2-1b": Preset(
        n_layers=16,
        n_heads=16,
        n_embd=2048,
        description="OLMo-2-0425-1B's shape: 1.485B parameters at vocab 100352",
    ),
}


class OLMo2(Llama):
    """OLMo 2: :class:`Llama` with post-branch norms (``x + attn_norm(attn(x))``, ``x +
    mlp_norm(mlp(x))``; no norm before a branch) and query/key RMSNorm over the whole projection
    (``query_norm`` / ``key_norm``, ``scale`` ``[heads * head_dim]``) before RoPE. The keys shared
    with Llama keep Llama's defaults; the OLMo 2 releases set ``architecture/rope_theta=5e5`` and
    ``architecture/norm_eps=1e-6`` (``hf/import`` reads both from ``config.json``).

    Presets (``architecture/preset``): ``tiny`` and ``olmo2-1b`` (the published OLMo-2-0425-1B
    shape). ``hf/import`` of a ``model_type: olmo2`` checkpoint builds this model.
    """

    PRESETS: ClassVar[dict[str, Preset]] = OLMO2_PRESETS
    FAMILY: ClassVar[str] = "OLMo2"
    QK_NORM: ClassVar[bool] = True
    QK_NORM_SPAN: ClassVar[str] = "projection"
    NORM_PLACEMENT: ClassVar[str] = "post"
