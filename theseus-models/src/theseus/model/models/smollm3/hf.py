"""SmolLM3 checkpoints (``SmolLM3ForCausalLM``) <-> theseus' ``SmolLM3``: the ``hf/smollm3`` family.

Llama's tensors and ``config.json`` (``attention_bias`` on the query, key, value and output projections,
``mlp_bias``), plus ``no_rope_layers`` (per layer 1 = RoPE, 0 = NoPE; transformers' default: every
``no_rope_layer_interval``-th layer NoPE) <-> ``architecture/no_rope_layers``. A RoPE base left out of
``config.json`` is transformers' 2e6. SmolLM3's optional sliding window (``use_sliding_window``, on the
NoPE layers) is refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.errors import ConfigError
from theseus.model.huggingface.config_fields import rope_keys
from theseus.model.huggingface.family import Identity, cannot, require, unsupported
from theseus.model.layers.attention import FULL_ATTENTION
from theseus.model.layers.rotary import rope_layer_flags
from theseus.model.models.llama.hf import LlamaFamily
from theseus.model.stack.architecture import Architecture

SMOLLM3_CLASS = "theseus.model.models.smollm3.model:SmolLM3"

#: transformers' ``SmolLM3Config`` defaults of the fields a ``config.json`` may leave out.
DEFAULT_THETA, DEFAULT_INTERVAL = 2000000.0, 4


class SmolLM3Family(LlamaFamily):
    """``model_type: smollm3``."""

    identity: ClassVar[Identity] = Identity("smollm3", "SmolLM3ForCausalLM", SMOLLM3_CLASS)

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        keys = super().keys({"tie_word_embeddings": True, **config})
        keys["architecture/no_rope_layers"] = [int(rope) for rope in self.rope_layers(config)]
        return keys

    def rope_layers(self, config: Mapping[str, Any]) -> tuple[bool, ...]:
        """Per layer whether it rotates: ``no_rope_layers``, or every ``no_rope_layer_interval``-th NoPE."""
        n_layers = int(require(config, "num_hidden_layers"))
        flags = config.get("no_rope_layers")
        interval = int(config.get("no_rope_layer_interval") or DEFAULT_INTERVAL)
        try:
            return rope_layer_flags(None if flags is None else [int(f) for f in flags], n_layers, interval)
        except ConfigError as error:
            raise unsupported("no_rope_layers", flags, f"expected {n_layers} entries of 0 / 1") from error

    def window(self, config: Mapping[str, Any]) -> int | None:
        """None: every layer attends to the whole sequence; a window (``use_sliding_window`` with a
        ``sliding_window``, on the NoPE layers or as ``layer_types`` say) is refused."""
        types = config.get("layer_types") or [FULL_ATTENTION]
        if config.get("use_sliding_window") and config.get("sliding_window") is not None:
            raise unsupported("use_sliding_window", True, "theseus' SmolLM3 has no sliding-window layers")
        if set(types) != {FULL_ATTENTION}:
            raise unsupported("layer_types", list(types), f"theseus' SmolLM3 layers are all {FULL_ATTENTION!r}")
        return None

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Llama's RoPE keys; the base defaults to SmolLM3's 2e6."""
        parameters = {"rope_theta": DEFAULT_THETA, **(config.get("rope_parameters") or {})}
        return rope_keys({**config, "rope_parameters": parameters})

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        from theseus.model.models.smollm3.model import SmolLM3Architecture

        if not isinstance(arch, SmolLM3Architecture):
            raise cannot(self.model_type, "a model other than SmolLM3")
        config = super().config(arch, settings)
        config.update(
            {
                "no_rope_layers": [int(rope) for rope in arch.rope_layers],
                "no_rope_layer_interval": DEFAULT_INTERVAL,
                "use_sliding_window": False,
                "sliding_window": None,
                "layer_types": [FULL_ATTENTION] * arch.n_layers,
                "pad_token_id": None,  # SmolLM3Config's default (128004) may be past the vocabulary
            }
        )
        return config


__all__ = ["SMOLLM3_CLASS", "SmolLM3Family"]
