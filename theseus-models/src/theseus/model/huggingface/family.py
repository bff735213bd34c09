"""A Hugging Face model family as a component: ``config.json`` <-> ``architecture/*`` keys and the
checkpoint's tensor names <-> the theseus parameters, both ways.

Families register under ``theseus.components`` as ``hf/<model_type>`` (``hf/gpt2``, ``hf/llama``);
``hf/import``, ``hf/export``, ``training/init_from=hf:`` and ``hf/export-adapter`` find them by
``model_type`` through the registry, so a plugin model imports and exports checkpoints the same way
the built-in ones do. Each family lives in its model's folder (``theseus.model.models.gpt.hf``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from theseus.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from theseus.model.huggingface.names import TensorMap
    from theseus.model.stack.architecture import Architecture

#: The component kind families register under.
KIND = "hf"


@dataclass(frozen=True)
class PeftLayout:
    """The PEFT modules of one layer (below its prefix): ``modules`` (a LoRA target -> its own module),
    ``fused`` (a module -> the targets of its output rows, in order) and ``interleaved`` (a module ->
    the projections of each group of its rows, in order; see ``HFFamily.peft_interleaved``)."""

    modules: Mapping[str, str]
    fused: Mapping[str, tuple[str, ...]]
    interleaved: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Identity:
    """What names a family: ``config.json``'s ``model_type``, the transformers class written into its
    ``architectures`` and, for a family that brings a model of its own, that theseus model
    (``"module:Class"``). A family without one (Mistral and Qwen2 on Llama's model, a multimodal
    checkpoint's language model) keeps the model class of the family it extends."""

    model_type: str
    hf_class: str
    model_class: str | None = None


class HFFamily:
    """One ``model_type``: how its ``config.json`` and tensors map onto a theseus model class.

    Subclasses declare their :class:`Identity` (``identity = Identity("qwen3", "Qwen3ForCausalLM",
    QWEN3_CLASS)``, or set ``model_type``, ``hf_class`` and ``model_class`` themselves) and implement
    ``keys``, ``config`` and ``tensor_maps``; a field theseus cannot honour is refused with one line
    naming it (``unsupported``), never ignored.
    """

    #: The family's names; a subclass declaring one gets ``model_type``, ``hf_class``, ``model_class``
    #: and ``fallback`` from it (``fallback``: whether it names a model class of its own).
    identity: ClassVar[Identity | None] = None
    #: ``config.json``'s ``model_type`` (also the component name: ``hf/<model_type>``).
    model_type: ClassVar[str]
    #: The transformers class named in ``config.json``'s ``architectures``.
    hf_class: ClassVar[str]
    #: The theseus model, ``"module:Class"``.
    model_class: ClassVar[str]
    #: Exported as this family when no other family of the same model class describes the model.
    fallback: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        identity = cls.__dict__.get("identity")
        if identity is None:
            return
        cls.model_type, cls.hf_class = identity.model_type, identity.hf_class
        if identity.model_class is not None:
            cls.model_class = identity.model_class
        if "fallback" not in cls.__dict__:
            cls.fallback = identity.model_class is not None

    #: LoRA targets -> the module (below the layer prefix) PEFT adapts; see ``peft_layer_prefix``.
    peft_modules: ClassVar[Mapping[str, str]] = {}
    #: A module holding query, key and value fused (GPT-2's ``attn.c_attn``), or None.
    peft_fused_qkv: ClassVar[str | None] = None
    #: Modules that fuse several LoRA targets, with the targets in the order of their output rows
    #: (Phi-3's ``{"self_attn.qkv_proj": ("query", "key", "value"), "mlp.gate_up_proj": ("gate", "up")}``).
    peft_fused: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: Modules whose output rows go in groups, one per head of the first named attention projection,
    #: each group the named projections' rows of that head in order (Qwen3-Next's ``{"self_attn.q_proj":
    #: ("query", "gate")}``: a head's query, then its gate).
    peft_interleaved: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: Whether the checkpoint stores linear weights ``[in, out]`` (PEFT's ``fan_in_fan_out``).
    fan_in_fan_out: ClassVar[bool] = False

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The ``architecture/*`` keys that rebuild the network ``config`` describes."""
        raise NotImplementedError

    def canonical_name(self, name: str) -> str:
        """A checkpoint tensor name in the ``*ForCausalLM`` layout (e.g. with the base model's prefix)."""
        return name

    def checkpoint_keys(self, keys: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
        """``keys`` (from :meth:`keys`) fitted to the tensor ``names`` the checkpoint holds: a part that
        ``config.json`` declares but the weights lack (DeepSeek-V3's multi-token prediction, which
        transformers does not save) is left out of the model."""
        return keys

    def set_aside(self, name: str, config: Mapping[str, Any]) -> bool:
        """Whether tensor ``name`` belongs to a part of the checkpoint that ``config`` declares and that
        the model leaves out by design (as transformers does: DeepSeek-V3's multi-token-prediction
        layers); import skips such tensors instead of refusing the checkpoint."""
        return False

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        """Every checkpoint tensor of ``arch`` with the theseus parameters it holds."""
        raise NotImplementedError

    def constant_tensors(self, arch: Architecture) -> dict[str, np.ndarray]:
        """Checkpoint tensors that follow from the config alone (buffers such as Qwen4-Exp's n-gram hash
        multipliers), by name: import checks each one present equals its value, export writes it in its
        own dtype. None here."""
        return {}

    # -- export ------------------------------------------------------------------------------------
    def describes(self, arch: Architecture) -> bool:
        """Whether a model of ``model_class`` with ``arch`` is naturally this family (used to choose one
        for a model that was not imported)."""
        return self.fallback

    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The family's own ``config.json`` fields for ``arch``; ``cannot`` for what it cannot express.

        ``settings`` is the run's whole configuration, for models that read keys beyond ``arch``."""
        raise NotImplementedError

    def peft_layer_prefix(self, layer: int) -> str:
        """The module path of layer ``layer`` in the checkpoint (``model.layers.3.``)."""
        raise NotImplementedError

    def peft_fused_modules(self) -> dict[str, tuple[str, ...]]:
        """Every fused module (``peft_fused``, and ``peft_fused_qkv`` as query, key and value)."""
        modules = dict(self.peft_fused)
        if self.peft_fused_qkv is not None:
            modules[self.peft_fused_qkv] = ("query", "key", "value")
        return modules

    def peft_layout(self, arch: Architecture, layer: int) -> PeftLayout:
        """The PEFT modules of layer ``layer``: ``peft_modules``, the fused and interleaved modules, the
        same on every layer unless a family overrides this (layers of different kinds)."""
        return PeftLayout(dict(self.peft_modules), self.peft_fused_modules(), dict(self.peft_interleaved))

    def peft_mixer_layout(self, arch: Architecture, layer: int, mixer: str) -> PeftLayout:
        """The PEFT modules of layer ``layer``'s parallel mixer ``mixer`` (a block's ``parallel_mixers``:
        Falcon-H1's ``mamba``), its adapters' names -> modules below the layer's prefix: none unless a family
        names them, so that such an adapter is refused rather than left out."""
        return PeftLayout({}, {}, {})

    def to_config(
        self,
        arch: Architecture,
        settings: Mapping[str, Any],
        *,
        dtype: str,
        bos_id: int | None,
        eos_id: int | None,
    ) -> dict[str, Any]:
        """The whole ``config.json`` of ``arch``: the common fields and the family's."""
        common: dict[str, Any] = {
            "architectures": [self.hf_class],
            "model_type": self.model_type,
            "vocab_size": arch.vocab_size,
            "tie_word_embeddings": arch.tied_embeddings,
            "dtype": dtype,
            "torch_dtype": dtype,
            "bos_token_id": bos_id,
            "eos_token_id": eos_id,
            "use_cache": True,
        }
        return {**common, **self.config(arch, settings), **self.export_overrides(eos_id)}

    def export_overrides(self, eos_id: int | None) -> dict[str, Any]:
        """Fields :meth:`to_config` sets last, over the common and family fields (none here; a multimodal
        family's text model, Phi-3's padding token)."""
        return {}


class NestedLanguageModel(HFFamily):
    """A multimodal checkpoint of a text family (the next class in the MRO): the language model's
    ``config.json`` fields in ``text_config`` and its tensors under ``model.language_model.`` (the text
    family's ``model.``); the tensors under the :attr:`towers` prefixes (vision or audio encoders and their
    projections) are set aside on import, as theseus imports the language model only. Export writes the
    text family's checkpoint (:attr:`text`): theseus holds no tower to write. Qwen3.5 and Gemma 4 use it."""

    #: The prefix of the language model's tensors (``model.`` in ``*ForCausalLM``).
    language_model: ClassVar[str] = "model.language_model."
    #: Prefixes of the tensors the import sets aside (the towers the text model does not have).
    towers: ClassVar[tuple[str, ...]] = ()
    #: The text family a run of this family exports as (its ``identity``).
    text: ClassVar[Identity]

    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        text = require(config, "text_config")
        if not isinstance(text, Mapping):
            raise unsupported("text_config", text, "expected the language model's fields")
        tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        return super().keys({**text, "tie_word_embeddings": tied})

    def canonical_name(self, name: str) -> str:
        """``model.language_model.<rest>`` is the text family's ``model.<rest>``."""
        name = super().canonical_name(name)
        return "model." + name.removeprefix(self.language_model) if name.startswith(self.language_model) else name

    def set_aside(self, name: str, config: Mapping[str, Any]) -> bool:
        """The towers' tensors (:attr:`towers`) and what the text family sets aside."""
        return name.startswith(self.towers) or super().set_aside(name, config)

    def describes(self, arch: Architecture) -> bool:
        """Never chosen for a model that was not imported from it (the text family is)."""
        return False

    def export_overrides(self, eos_id: int | None) -> dict[str, Any]:
        """The text family's class and ``model_type``: the export holds the language model only."""
        text = {"architectures": [self.text.hf_class], "model_type": self.text.model_type}
        return {**super().export_overrides(eos_id), **text}


# -- one-line refusals, for families to use ----------------------------------------------------------
def unsupported(field: str, value: Any, why: str = "") -> ConfigError:
    """``config.json`` holds a value theseus cannot honour."""
    reason = f" ({why})" if why else ""
    return ConfigError(f"config.json field {field}={value!r} is not supported by theseus{reason}")


def require(config: Mapping[str, Any], field: str) -> Any:
    """A field ``config.json`` must have."""
    if config.get(field) is None:
        raise ConfigError(f"config.json has no {field!r}; the checkpoint's configuration is incomplete")
    return config[field]


def expect(config: Mapping[str, Any], field: str, allowed: Any) -> None:
    """A field that, when present, must hold ``allowed``."""
    value = config.get(field, allowed)
    if value != allowed:
        raise unsupported(field, value)


def cannot(family: str, what: str) -> ConfigError:
    """A checkpoint of ``family`` cannot express ``what`` of the model being exported."""
    return ConfigError(f"a {family} checkpoint cannot express {what}; this model cannot be exported as {family}")


# -- lookup through the registry ---------------------------------------------------------------------
def installed() -> list[str]:
    """The ``model_type`` of every installed family."""
    from theseus.registry import get_registry

    return sorted(entry.name for entry in get_registry().components_of(KIND))


def family(model_type: Any) -> HFFamily:
    """The installed family of ``model_type``; ConfigError naming the installed ones otherwise."""
    from theseus.errors import PluginError
    from theseus.registry import get_registry

    names = installed()
    if not isinstance(model_type, str) or model_type not in names:
        raise ConfigError(
            f"config.json model_type {model_type!r} is not supported; installed families: {', '.join(names)} "
            f"(a plugin adds one by registering an '{KIND}/<model_type>' component, see docs/huggingface.md)"
        )
    try:
        found = get_registry().load_component(KIND, model_type)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc
    made = found() if isinstance(found, type) else found
    if not isinstance(made, HFFamily):
        raise ConfigError(f"component '{KIND}/{model_type}' is a {type(made).__name__}, not an HFFamily")
    return made


def export_family(model_class: str, arch: Architecture, recorded: str | None = None) -> HFFamily:
    """The family a theseus model is exported as: the one it was imported from when recorded, else the
    installed family of its class that describes it (a more specific one before a fallback)."""
    if recorded is not None and recorded in installed():
        chosen = family(recorded)
        if chosen.model_class == model_class:
            return chosen
    candidates = [f for f in (family(name) for name in installed()) if f.model_class == model_class]
    if not candidates:
        raise ConfigError(
            f"cannot export a {model_class} model: no installed Hugging Face family converts it "
            f"(installed: {', '.join(installed())}; a plugin adds one as an '{KIND}/<model_type>' component)"
        )
    fitting = sorted((f for f in candidates if f.describes(arch)), key=lambda f: (f.fallback, f.model_type))
    return fitting[0] if fitting else candidates[0]


__all__ = [
    "KIND",
    "HFFamily",
    "Identity",
    "NestedLanguageModel",
    "PeftLayout",
    "cannot",
    "expect",
    "export_family",
    "family",
    "installed",
    "require",
    "unsupported",
]
