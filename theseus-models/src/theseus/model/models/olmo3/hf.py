"""OLMo 3 checkpoints (``Olmo3ForCausalLM``) <-> theseus' ``OLMo3``: the ``hf/olmo3`` family.

OLMo 2's tensors and ``config.json``, plus ``layer_types`` (sliding and full layers; transformers'
default: every fourth layer full) with the sliding layers' ``sliding_window``. ``rope_parameters``
holds one entry per layer type: the full layers' may scale (default, linear, llama3, yarn), the
sliding layers' is a plain base. An older ``config.json`` with one ``rope_theta`` / ``rope_scaling``
scales the full layers only and gives both kinds that base.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.config_fields import (
    interleaved_layer_types,
    plain_rope_theta,
    rope_config,
    rope_keys,
    sliding_window_of,
)
from theseus.model.huggingface.family import Identity, cannot
from theseus.model.layers.attention import FULL_ATTENTION, SLIDING_ATTENTION
from theseus.model.models.olmo2.hf import OLMo2Family
from theseus.model.stack.architecture import Architecture

OLMO3_CLASS = "theseus.model.models.olmo3.model:OLMo3"

#: transformers' ``rope_theta`` and ``sliding_window`` when ``config.json`` has none.
DEFAULT_THETA, DEFAULT_WINDOW = 500000.0, 4096
#: The ``config.json`` fields that hold RoPE settings.
ROPE_FIELDS = ("rope_parameters", "rope_scaling", "rope_theta")


class OLMo3Family(OLMo2Family):
    """``model_type: olmo3``."""

    identity: ClassVar[Identity] = Identity("olmo3", "Olmo3ForCausalLM", OLMO3_CLASS)
    holds_window: ClassVar[bool] = True
    #: transformers' layer_types when config.json has none: every this many layers one is full.
    full_every: ClassVar[int] = 4

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        keys = {**super().keys(config), "architecture/layer_types": self.layer_types(config)}
        if SLIDING_ATTENTION in keys["architecture/layer_types"] and keys.get("architecture/sliding_window") is None:
            keys["architecture/sliding_window"] = keys["architecture/block_size"]  # longer than any sequence
        return keys

    def layer_types(self, config: Mapping[str, Any]) -> list[str]:
        """``layer_types``, or transformers' default pattern."""
        return interleaved_layer_types(config, self.full_every)

    def window(self, config: Mapping[str, Any]) -> int | None:
        """The sliding layers' window; None when no layer slides."""
        return sliding_window_of(config, self.layer_types(config), DEFAULT_WINDOW)

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The full layers' RoPE as ``architecture/rope_*`` keys and the sliding layers' base as
        ``architecture/rope_local_theta``."""
        parameters = config.get("rope_parameters") or {}
        theta = float(config.get("rope_theta", DEFAULT_THETA))
        if FULL_ATTENTION in parameters or SLIDING_ATTENTION in parameters:
            full, sliding = parameters.get(FULL_ATTENTION) or {}, parameters.get(SLIDING_ATTENTION) or {}
        else:  # one entry (or none) for the full layers
            full, sliding = parameters, {}
        full = {"rope_theta": theta, **full, **(config.get("rope_scaling") or {})}
        rest = {name: value for name, value in config.items() if name not in ROPE_FIELDS}
        local = plain_rope_theta(sliding, f"rope_parameters.{SLIDING_ATTENTION}", theta)
        return {**rope_keys({**rest, "rope_parameters": full}), "architecture/rope_local_theta": local}

    # -- export ------------------------------------------------------------------------------------
    def rope_config(self, arch: Architecture) -> dict[str, Any]:
        """One ``rope_parameters`` entry per layer type; ``rope_scaling`` repeats the full layers'."""
        local = arch.position.theta if arch.position.local_theta is None else arch.position.local_theta
        full = rope_config(arch)
        sliding = {"rope_type": "default", "rope_theta": local}
        return {**full, "rope_parameters": {FULL_ATTENTION: full["rope_parameters"], SLIDING_ATTENTION: sliding}}

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        if arch.position.scaling.kind == "longrope":
            raise cannot(self.model_type, "architecture/rope_scaling=longrope")
        types = list(
            arch.layer_types or [SLIDING_ATTENTION if arch.attention.sliding_window else FULL_ATTENTION] * arch.n_layers
        )
        return {**super().family_config(arch), "layer_types": types, "sliding_window": arch.attention.sliding_window}


__all__ = ["OLMO3_CLASS", "OLMo3Family"]
