"""Generated damage to Hugging Face ``config.json`` files of several families: fields removed or given
values of every type (NaN, infinity, negative and huge sizes, text, lists, nested mappings), RoPE entries
and window fields mangled. Reading one as ``hf/import`` does (family, ``architecture/*`` keys, the
model's configuration, its architecture and tensor plan; no weights) either works or stops in one line.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.reliability.fuzzing import ACCEPTED, ONE_LINE, attempt, fuzz_settings, hostile_value

_DECODER = {
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 257,
    "eos_token_id": 256,
}
#: Small ``config.json`` files as transformers writes them, one per family.
CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": {
        "model_type": "gpt2",
        "vocab_size": 300,
        "n_positions": 320,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "bos_token_id": 256,
        "eos_token_id": 256,
    },
    "llama": {
        **_DECODER,
        "model_type": "llama",
        "attention_bias": False,
        "mlp_bias": False,
        "head_dim": 8,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
    },
    "qwen2": {
        **_DECODER,
        "model_type": "qwen2",
        "use_sliding_window": False,
        "sliding_window": 64,
        "max_window_layers": 2,
        "tie_word_embeddings": True,
    },
    "mistral": {**_DECODER, "model_type": "mistral", "sliding_window": 64, "head_dim": 8},
    "mixtral": {
        **_DECODER,
        "model_type": "mixtral",
        "sliding_window": None,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "router_jitter_noise": 0.0,
    },
    "phi3": {
        **_DECODER,
        "model_type": "phi3",
        "original_max_position_embeddings": 512,
        "rope_scaling": None,
        "sliding_window": None,
        "partial_rotary_factor": 1.0,
    },
}
#: Fields a family may read besides those of its base file.
FIELDS = (
    "model_type",
    "rope_scaling",
    "rope_parameters",
    "layer_types",
    "sliding_window",
    "head_dim",
    "partial_rotary_factor",
    "quantization_config",
    "text_config",
    "original_max_position_embeddings",
)
ROPE_FIELDS = ("rope_type", "type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def edit() -> st.SearchStrategy[tuple[str, str, Any]]:
    """``(how, field, value)``: delete a field, set it, or set a field of its RoPE entry."""
    return st.one_of(
        st.tuples(st.just("delete"), st.sampled_from(sorted({*_DECODER, *CONFIGS["gpt2"], *FIELDS})), st.none()),
        st.tuples(st.just("set"), st.sampled_from(sorted({*_DECODER, *CONFIGS["gpt2"], *FIELDS})), hostile_value()),
        st.tuples(st.just("rope"), st.sampled_from(ROPE_FIELDS), hostile_value()),
        st.tuples(
            st.just("set"),
            st.sampled_from(("num_hidden_layers", "n_layer", "hidden_size", "n_head")),
            st.integers(-3, 3),
        ),
    )


def damaged(family: str, edits: list[tuple[str, str, Any]]) -> dict[str, Any]:
    config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in CONFIGS[family].items()}
    for how, field, value in edits:
        if how == "delete":
            config.pop(field, None)
        elif how == "set":
            config[field] = value
        else:
            rope = config.get("rope_scaling")
            config["rope_scaling"] = {**(rope if isinstance(rope, dict) else {"rope_type": "linear"}), field: value}
    return config


def read_config(config: dict[str, Any]) -> None:
    """What ``hf/import`` derives from ``config.json`` before it reads a tensor (``importer.prepare``), for
    weights of 1,000 tensors none larger than 4,096 in any dimension."""
    from theseus.config import configuration, configure
    from theseus.model.huggingface.config_checks import WeightSizes
    from theseus.model.huggingface.convert import from_config
    from theseus.model.huggingface.importer import import_class, model_configuration

    found, imported = from_config(config, WeightSizes(tensors=1000, largest=4096))
    model_cls = import_class(imported.model_class)
    with configuration(model_configuration(model_cls, imported.keys)):
        model = configure(model_cls)
    found.tensor_maps(model.architecture)


def test_each_family_s_intact_config_reads() -> None:
    for config in CONFIGS.values():
        read_config(config)


def test_damaged_config_json_is_read_or_refused_in_one_line() -> None:
    tally: Counter[str] = Counter()

    @fuzz_settings(max_examples=400)
    @given(family=st.sampled_from(sorted(CONFIGS)), edits=st.lists(edit(), min_size=1, max_size=3))
    def check(family: str, edits: list[tuple[str, str, Any]]) -> None:
        attempt(tally, read_config, damaged(family, edits))

    check()
    assert sum(tally.values()) >= 400 and tally[ACCEPTED] and tally[ONE_LINE]
