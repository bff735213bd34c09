"""Run in a subprocess with four host devices: every imported family's logits on a ``fsdp+tp`` mesh
(data 2 x model 2) and on one device; a mixture's experts are placed slice by slice.

``python -m tests.huggingface.families_sharded_run TMP FAMILY...`` prints one line per family:
``<family> <distinct shards of the first full-attention layer's query kernel> <of the last layer's expert gate,
0 for dense> <max |sharded - one device|>``. A family named in ``test_moe_families.CASES`` is saved as that
mixture case; ``deepseek_v3`` as its ``plain_query`` case (latent attention without the query bottleneck).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.conftest import xla_flags

os.environ["XLA_FLAGS"] = xla_flags(devices=4)
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import jax.numpy as jnp
import numpy as np

from tests.huggingface.conftest import VOCAB, save_model
from tests.huggingface.test_deepseek_v3 import save_deepseek
from tests.huggingface.test_moe_families import CASES as MIXTURES
from tests.huggingface.test_moe_families import VOCAB as MIXTURE_VOCAB
from tests.huggingface.test_moe_families import save_moe
from theseus.model.huggingface.importer import abstract_params, flat_paths, prepare, read_params
from theseus.model.loading.run import param_shardings
from theseus.training.sharding import build_sharding

#: Two layers where the import tests save more (their configurations' 3 or 4): still one layer of each kind
#: the sharding rules meet (Gated DeltaNet and gated full attention, a dense MLP then a mixture, Llama 4's local
#: RoPE layer then its global NoPE mixture), at about half the tracing and compiling per family. One layer for
#: the families whose layers are all alike: the rules place each kind of parameter, whatever its layer.
ONE_LAYER = {"num_hidden_layers": 1}
TWO_LAYERS = {"num_hidden_layers": 2}
HYBRID = {**TWO_LAYERS, "layer_types": ["linear_attention", "full_attention"]}
FEWER_LAYERS = {
    "llama4_text": TWO_LAYERS,
    "qwen3_next": HYBRID,
    "glm4_moe": TWO_LAYERS,
    "qwen3_5_text": HYBRID,
    "qwen3_5_moe": HYBRID,
    "deepseek_v3": TWO_LAYERS,  # the dense layer, then a mixture
    **dict.fromkeys(("mistral", "qwen3", "olmo2", "phi3", "mixtral", "minimax_m2"), ONE_LAYER),
}


def distinct_shards(leaf: jax.Array) -> int:
    return len({str(shard.index) for shard in leaf.addressable_shards})


def first_attention(layer_types: tuple[str, ...] | None) -> int:
    """The first attention layer (Qwen3-Next's Gated DeltaNet layers have their own query, LFM2's short
    convolutions none)."""
    return next((i for i, kind in enumerate(layer_types or ()) if kind not in ("linear_attention", "conv")), 0)


def compare(folder: Path, family: str) -> tuple[int, int, float]:
    mixture = family in MIXTURES or family in ("deepseek_v3", "gpt_oss", "llama4_text", "qwen3_next", "minimax_m2")
    mixture = mixture or family in ("deepseek_v32", "glm_moe_dsa", "glm4_moe")
    mixture = mixture or family == "qwen3_5_moe"
    if family == "deepseek_v3":
        save_deepseek(folder, "plain_query", **FEWER_LAYERS[family])
    elif family in MIXTURES:
        save_moe(folder, family, **FEWER_LAYERS.get(family, {}))
    else:
        save_model(folder, family, tokenizer=False, **FEWER_LAYERS.get(family, {}))
    prepared = prepare(folder)
    model = prepared.model
    vocab = MIXTURE_VOCAB if mixture else VOCAB
    ids = np.random.default_rng(2).integers(0, vocab, (4, 12))
    mask = np.ones_like(ids, dtype=bool)
    mask[1, :3] = False

    def logits(params: object, x: jax.Array, m: jax.Array) -> jax.Array:
        return model.apply({"params": params}, x, padding_mask=m, deterministic=True)[0]

    # the parameters' shapes traced once for both reads (each read would trace the model's init again)
    wanted = abstract_params(model)
    single = np.asarray(jax.jit(logits)(read_params(prepared, wanted=wanted), jnp.asarray(ids), jnp.asarray(mask)))
    sharding = build_sharding(model.sharding, layout="fsdp+tp", data=2, model=2)
    params = read_params(prepared, flat_paths(param_shardings(model, sharding)), wanted=wanted)
    batch = sharding.put_batch({"ids": ids, "mask": mask})
    with sharding.context():
        sharded = np.asarray(sharding.fetch(jax.jit(logits)(params, batch["ids"], batch["mask"])))
    placed = flat_paths(params)
    query = distinct_shards(placed[(f"blocks_{first_attention(model.architecture.layer_types)}", "attn", "query")])
    gate = placed.get((f"blocks_{model.architecture.n_layers - 1}", "mlp", "gate"))
    experts = distinct_shards(gate) if mixture and gate is not None else 0
    return query, experts, float(np.max(np.abs(sharded - single)[mask]))


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for name in sys.argv[2:]:
        print(name, *compare(root / name, name), flush=True)
