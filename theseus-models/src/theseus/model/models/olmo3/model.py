"""``OLMo3``: OLMo 2 with sliding-window layers interleaved with full-attention ones (``layer_types``)."""

from __future__ import annotations

from typing import Any, ClassVar

from theseus.model.layers._common import optional_key
from theseus.model.models.olmo2.model import OLMO2_PRESETS, OLMo2
from theseus.model.stack.architecture import Preset
from theseus.model.stack.windows import InterleavedWindows

OLMO3_PRESETS: dict[str, Preset] = {
    "tiny": OLMO2_PRESETS["tiny"],
    # allenai/Olmo-3-1025-7B's config.json: 32 layers, 32 heads of 128 (no grouping), 4096 wide,
    # intermediate 11008, untied head; 7.299B parameters at vocab 100352.
    "olmo3-7b": Preset(
        n_layers=32,
        n_heads=32,
        n_embd=4096,
        mlp_ratio=11008 / 4096,
        description="Olmo-3-1025-7B's shape: 7.299B parameters at vocab 100352",
    ),
}


class OLMo3(InterleavedWindows, OLMo2):
    """OLMo 3: :class:`OLMo2` whose ``architecture/layer_types`` (None: three sliding layers, then one
    full, repeated) give the ``architecture/sliding_window`` (None: 4096, at most the block size) to the
    sliding layers only. The sliding layers rotate with ``architecture/rope_local_theta`` (None:
    ``architecture/rope_theta``) and without ``architecture/rope_scaling``, which scales the full layers
    only (the 7B release's YaRN). The releases set ``architecture/rope_theta=5e5`` (``hf/import`` reads
    the RoPE settings of both layer kinds from ``config.json``).

    Presets (``architecture/preset``): ``tiny`` and ``olmo3-7b`` (the published Olmo-3-1025-7B
    shape). ``hf/import`` of a ``model_type: olmo3`` checkpoint builds this model.
    """

    PRESETS: ClassVar[dict[str, Preset]] = OLMO3_PRESETS
    FAMILY: ClassVar[str] = "OLMo3"
    DEFAULT_WINDOW: ClassVar[int] = 4096
    FULL_EVERY: ClassVar[int] = 4

    rope_local_theta: float | None = optional_key(
        "architecture/rope_local_theta", "rotary base of the sliding-window layers", "architecture/rope_theta"
    )

    def _extra_architecture(self) -> dict[str, Any]:
        return {**super()._extra_architecture(), "local_rope_theta": self.rope_local_theta}


__all__ = ["OLMO3_PRESETS", "OLMo3"]
