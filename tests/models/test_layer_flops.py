"""A model's FLOPs are its head plus its layers' own counts, each layer as the model builds it (dense
or mixture, its window), and its ``architecture`` is resolved once per instance. Nothing here is
initialised or compiled: the counts are analytic and work on unbound modules."""

from __future__ import annotations

import dataclasses

import pytest

from theseus.config import configuration, configure
from theseus.model.layers import MLP, AttentionSpec, CausalSelfAttention
from theseus.model.layers.latent_attention import LatentAttention
from theseus.model.layers.moe import MoE
from theseus.model.models import DeepseekV3, Gemma3, Mixtral, TransformerLM
from theseus.model.models.deepseek_v3.model import DeepseekV3Block
from theseus.model.stack.windows import pattern_layer_types


def head_flops(model: TransformerLM, seq: int) -> int:
    arch = model.architecture
    return 6 * seq * arch.n_embd * arch.padded_vocab_size


def test_deepseek_v3_adds_its_dense_and_mixture_layers_and_its_prediction_depth() -> None:
    keys = {"architecture/preset": "tiny", "architecture/mtp_depth": 1}
    with configuration(keys):
        model = configure(DeepseekV3)
        arch = model.architecture
        assert arch.moe is not None and arch.mla is not None
        # the parts built on their own, from the resolved sizes
        attention = configure(
            LatentAttention, **dataclasses.asdict(arch.mla), n_embd=arch.n_embd, n_heads=arch.attention.n_heads
        )
        mlp = configure(MLP, n_embd=arch.n_embd, d_ff=arch.feed_forward.d_ff, activation=arch.feed_forward.activation)
        moe = configure(
            MoE,
            **dataclasses.asdict(arch.moe),
            n_embd=arch.n_embd,
            d_ff=arch.feed_forward.d_ff,
            activation=arch.feed_forward.activation,
        )
        blocks = [configure(DeepseekV3Block, architecture=arch, dense=dense) for dense in (True, False)]
    seq = 48
    dense, mixture = (attention.flops(seq) + ffn.flops(seq) for ffn in (mlp, moe))
    assert [block.flops(seq) for block in blocks] == [dense, mixture] and dense != mixture
    first = arch.moe.first_k_dense
    assert first == 1 and model.layer_flops(seq) == [dense] * first + [mixture] * (arch.n_layers - first)
    # one multi-token-prediction depth: eh_proj, a mixture layer and the shared head
    depth = 6 * seq * 2 * arch.n_embd * arch.n_embd + mixture + head_flops(model, seq)
    assert model.flops(seq) == head_flops(model, seq) + sum(model.layer_flops(seq)) + depth


def test_gemma3_counts_each_sliding_layer_within_its_window() -> None:
    window = 16
    with configuration(
        {"architecture/preset": "tiny", "architecture/block_size": 64, "architecture/sliding_window": 16}
    ):
        model = configure(Gemma3)
        arch = model.architecture
        spec = AttentionSpec(
            arch.attention.n_heads, arch.attention.kv_heads, head_dim=arch.head_dim, sliding_window=window
        )
        attention = configure(CausalSelfAttention, n_embd=arch.n_embd, spec=spec, layer_types=arch.layer_types)
        mlp = configure(MLP, n_embd=arch.n_embd, d_ff=arch.feed_forward.d_ff, activation=arch.feed_forward.activation)
    assert arch.layer_types == pattern_layer_types(6, 6)  # five sliding layers, then a full one
    projections = 6 * (attention.matmul_params() + mlp.matmul_params())
    scores = 12 * arch.attention.n_heads * arch.head_dim

    def expected(seq: int, kind: str) -> int:
        keys = min(seq, window) if kind == "sliding_attention" else seq
        return seq * projections + seq * keys * scores

    for seq in (8, 64):  # within the window every layer counts the full square; past it, the window
        layers = model.layer_flops(seq)
        assert layers == [expected(seq, kind) for kind in arch.layer_types]
        assert layers == [attention.flops(seq, layer=i) + mlp.flops(seq) for i in range(arch.n_layers)]
        assert model.flops(seq) == head_flops(model, seq) + sum(layers)
    assert len(set(model.layer_flops(8))) == 1 and len(set(model.layer_flops(64))) == 2


def test_architecture_is_resolved_once_per_instance_and_a_clone_resolves_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolved: list[int] = []
    resolve = Mixtral.resolve_architecture

    def counted(self: Mixtral) -> object:
        resolved.append(self.vocab_size)
        return resolve(self)

    monkeypatch.setattr(Mixtral, "resolve_architecture", counted)
    with configuration({"architecture/preset": "tiny"}):
        model = configure(Mixtral)
    arch = model.architecture
    assert model.architecture is arch and arch.moe is not None  # the mixture's part of the resolution kept
    model.flops(16)
    model.layer_runs  # noqa: B018 (reads the architecture once per layer)
    assert resolved == [257]
    wider = model.clone(vocab_size=1000)
    assert wider.architecture.vocab_size == 1000 and model.architecture.vocab_size == 257
    assert resolved == [257, 1000]
