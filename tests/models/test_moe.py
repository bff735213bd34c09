"""The mixture-of-experts layer against a loop over experts, its losses by hand, bias balancing, the
mixture models' published sizes and active-parameter FLOPs, bad input in one line, and a scanned
mixture's training memory per layer."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.conftest import jitted, parameter_shapes, random_params
from tests.tolerances import float32_tolerance, model_ops
from theseus.base.sown import AUX_COLLECTIONS
from theseus.config import Schema, configuration, configure, resolve
from theseus.errors import ConfigError
from theseus.model.layers._common import ACTIVATIONS
from theseus.model.layers.moe import (
    MoE,
    MoESpec,
    blocked_experts,
    capacity_experts,
    capacity_slots,
    dropless_experts,
    expert_capacity,
    load_balancing_loss,
    loop_over_experts,
    route,
    router_z_loss,
)
from theseus.training.steps import apply_param_updates

N, D, F, E, K = 24, 16, 12, 6, 2
SILU = ACTIVATIONS["swiglu"]


def arrays(seed: int = 0) -> tuple[jax.Array, jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    keys = jax.random.split(jax.random.key(seed), 5)
    tokens = jax.random.normal(keys[0], (N, D))
    router = jax.random.normal(keys[1], (D, E))
    shapes = [(E, D, F), (E, D, F), (E, F, D)]
    kernels = tuple(0.3 * jax.random.normal(k, s) for k, s in zip(keys[2:], shapes, strict=True))
    return tokens, router, kernels  # type: ignore[return-value]


def layer_output(dispatch: str, spec: MoESpec, tokens: jax.Array, router: jax.Array, kernels: Any) -> jax.Array:
    routing = route(tokens @ router, spec)
    if dispatch == "dropless":
        return dropless_experts(tokens, routing, kernels, SILU)
    if dispatch == "blocks":
        return blocked_experts(tokens, routing, kernels, SILU)
    if dispatch == "capacity":
        return capacity_experts(tokens, routing, kernels, SILU, expert_capacity(N, spec))[0]
    kept = None
    if spec.capacity_factor is not None:
        kept = capacity_slots(routing.experts, E, expert_capacity(N, spec))[1]
    return loop_over_experts(tokens, routing, kernels, SILU, kept)


@pytest.mark.parametrize(("dispatch", "capacity_factor"), [("dropless", None), ("blocks", None), ("capacity", 0.75)])
def test_dispatch_equals_a_loop_over_experts_forward_and_gradients(
    dispatch: str, capacity_factor: float | None
) -> None:
    spec = MoESpec(n_experts=E, top_k=K, expert_hidden=F, capacity_factor=capacity_factor)
    tokens, router, kernels = arrays()
    output = jax.jit(layer_output, static_argnums=(0, 1))  # each a program: eagerly, every operation is one
    got = output(dispatch, spec, tokens, router, kernels)
    expected = output("loop", spec, tokens, router, kernels)
    assert float(jnp.max(jnp.abs(got - expected))) <= 1e-5

    def loss(which: str) -> Any:
        return jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(layer_output(which, spec, *a))), argnums=(0, 1, 2)))

    grads, reference = loss(dispatch)(tokens, router, kernels), loss("loop")(tokens, router, kernels)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(reference), strict=True):
        assert float(jnp.max(jnp.abs(g - r))) <= 1e-5
    assert float(jnp.max(jnp.abs(grads[1]))) > 0  # the router learns through the routing weights

    routing = route(tokens @ router, spec)
    if capacity_factor is None:  # dropless: every copy reaches its expert
        assert int(jnp.sum(jnp.bincount(routing.experts.reshape(-1), length=E))) == N * K
    else:  # capacity ceil(0.75 * 24 * 2 / 6) = 6: some copies are dropped, exactly as a Python count says
        capacity = expert_capacity(N, spec)
        assert capacity == 6
        kept = np.asarray(capacity_slots(routing.experts, E, capacity)[1])
        experts, taken, expected_kept = np.asarray(routing.experts), [0] * E, np.zeros((N, K), bool)
        for j in range(K):  # first choices before second choices, then token order
            for n in range(N):
                expected_kept[n, j] = taken[experts[n, j]] < capacity
                taken[experts[n, j]] += 1
        assert (kept == expected_kept).all() and 0 < (~kept).sum() < N * K


def apply_layer(layer: MoE, x: jax.Array, **kwargs: Any) -> tuple[jax.Array, Any, Any]:
    variables = jitted(layer.init, jax.random.key(1), x)
    out, sown = jitted(layer.apply, variables, x, mutable=list(AUX_COLLECTIONS), **kwargs)
    return out, sown, variables["params"]


def test_the_layer_reports_drops_only_with_a_capacity_and_sows_its_losses() -> None:
    x = jax.random.normal(jax.random.key(0), (2, 12, D))
    dropless, sown, params = apply_layer(MoE(n_experts=E, top_k=K, expert_hidden=F, aux_loss=0.5, z_loss=0.25), x)
    assert float(sown["aux_metrics"]["moe_drop_rate"]) == 0.0
    assert float(sown["aux_metrics"]["moe_tokens_mean"]) == N * K / E
    # the module equals the reference computed from its own parameters
    unboxed = {k: getattr(v, "value", v) for k, v in params.items()}
    tokens = x.reshape(-1, D)
    routing = route(tokens @ unboxed["router"], MoESpec(n_experts=E, top_k=K, expert_hidden=F))
    kernels = (unboxed["gate"], unboxed["up"], unboxed["down"])
    reference = loop_over_experts(tokens, routing, kernels, SILU).reshape(x.shape)
    assert float(jnp.max(jnp.abs(dropless - reference))) <= 1e-5
    losses = sown["aux_losses"]
    assert float(losses["load_balancing"]) == pytest.approx(0.5 * float(load_balancing_loss(routing, E)), rel=1e-6)
    assert float(losses["router_z"]) == pytest.approx(0.25 * float(router_z_loss(tokens @ unboxed["router"])), rel=1e-5)

    capped = MoE(n_experts=E, top_k=K, expert_hidden=F, capacity_factor=0.5)
    _, sown, _ = apply_layer(capped, x)
    assert 0.0 < float(sown["aux_metrics"]["moe_drop_rate"]) < 1.0


def test_load_balancing_and_z_loss_equal_a_hand_computation() -> None:
    logits = jnp.asarray([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 1.0, 4.0], [0.5, 0.0, 0.0]])
    spec = MoESpec(n_experts=3, top_k=1, expert_hidden=4)
    routing = route(logits, spec)
    probs = np.exp(np.asarray(logits)) / np.exp(np.asarray(logits)).sum(-1, keepdims=True)
    # top-1 experts 0, 1, 2, 0: fractions (2/4, 1/4, 1/4); mean probabilities per expert
    fractions = np.array([0.5, 0.25, 0.25])
    hand = 3 * float(np.sum(fractions * probs.mean(0)))
    assert float(load_balancing_loss(routing, 3)) == pytest.approx(hand, rel=1e-6)
    lse = np.log(np.exp(np.asarray(logits)).sum(-1))
    assert float(router_z_loss(logits)) == pytest.approx(float(np.mean(lse**2)), rel=1e-6)
    assert np.asarray(routing.weights).ravel().tolist() == [1.0] * 4  # top-1, renormalised

    # the same as transformers' Mixtral loss for one layer, at top-2
    import torch
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    wide = jax.random.normal(jax.random.key(3), (10, 5))
    two = route(wide, MoESpec(n_experts=5, top_k=2, expert_hidden=4))
    theirs = load_balancing_loss_func((torch.tensor(np.asarray(wide)),), 5, 2)
    assert float(load_balancing_loss(two, 5)) == pytest.approx(float(theirs), rel=1e-5)


def test_bias_updates_move_a_skewed_sigmoid_router_towards_uniform_load() -> None:
    layer = MoE(n_experts=4, top_k=1, expert_hidden=8, router="sigmoid", bias_update_rate=0.01, aux_loss=0.0)
    x = jax.random.normal(jax.random.key(0), (4, 16, 8)).at[..., 0].set(1.0)
    variables = jitted(layer.init, jax.random.key(1), x)
    params = {k: getattr(v, "value", v) for k, v in variables["params"].items()}
    params["router"] = (0.3 * jax.random.normal(jax.random.key(5), (8, 4))).at[0, 0].set(2.0)  # expert 0 wins

    @jax.jit
    def step(p: Any) -> tuple[Any, jax.Array]:
        _, sown = layer.apply({"params": p}, x, mutable=list(AUX_COLLECTIONS))
        imbalance = sown["aux_metrics"]["moe_tokens_max"] / sown["aux_metrics"]["moe_tokens_mean"]
        return apply_param_updates(p, sown["param_updates"]), imbalance

    imbalances = []
    for _ in range(100):
        params, imbalance = step(params)
        imbalances.append(float(imbalance))
    assert imbalances[0] > 3.0  # most of the 64 tokens on one expert (max / mean load; 4 = all of them)
    assert max(imbalances[-10:]) < 1.25  # measured: 1.06-1.19
    assert float(params["router_bias"][0]) < 0 < float(jnp.max(params["router_bias"][1:]))
    # no update where the loss is evaluated only
    _, sown = jitted(layer.apply, {"params": params}, x, deterministic=True, mutable=list(AUX_COLLECTIONS))
    assert "param_updates" not in sown


def test_sigmoid_groups_choose_within_the_best_groups() -> None:
    spec = MoESpec(n_experts=8, top_k=2, expert_hidden=4, router="sigmoid", n_group=4, topk_group=1)
    logits = jnp.asarray([[0.0, 0.1, 5.0, 4.0, 4.5, 0.0, 0.0, 0.0]])  # group 1 = experts 2, 3 sums highest
    routing = route(logits, spec)
    assert sorted(np.asarray(routing.experts)[0].tolist()) == [2, 3]
    assert float(jnp.sum(routing.weights)) == pytest.approx(1.0)
    scaled = route(logits, dataclasses.replace(spec, routed_scaling_factor=2.5, norm_topk_prob=False))
    expected = jax.nn.sigmoid(jnp.asarray([5.0, 4.0])) * 2.5
    assert np.allclose(np.sort(np.asarray(scaled.weights)[0]), np.sort(np.asarray(expected)), atol=1e-6)


def model_of(cls: type, **keys: Any) -> Any:
    config = resolve(Schema.build(cls.gather()), overrides=keys)
    with configuration(config):
        return configure(cls)


@pytest.mark.parametrize(
    ("name", "preset", "vocab", "total", "active"),
    [("mixtral", "mixtral-8x7b", 32000, 46.7, 12.9), ("qwen3_moe", "qwen3-30b-a3b", 151936, 30.5, 3.3)],
)
def test_published_sizes_total_and_active_and_active_flops(
    name: str, preset: str, vocab: int, total: float, active: float
) -> None:
    """Counts as transformers builds the exported config (meta device: nothing allocated); active from
    the config's own numbers; FLOPs count the active weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from theseus.model.huggingface.family import family
    from theseus.model.models import Mixtral, Qwen3MoE

    model = model_of(Mixtral if name == "mixtral" else Qwen3MoE, **{"architecture/preset": preset})
    model = model.clone(vocab_size=vocab)
    arch = model.architecture
    config = family(name).to_config(arch, {}, dtype="float32", bos_id=None, eos_id=None)
    hf_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(hf_config)
    hf_total = sum(p.numel() for p in hf_model.parameters())
    experts = config.get("num_local_experts", config.get("num_experts"))
    hidden = config.get("moe_intermediate_size", config["intermediate_size"])
    inactive = (
        config["num_hidden_layers"] * (experts - config["num_experts_per_tok"]) * 3 * config["hidden_size"] * hidden
    )
    assert model.parameter_count() == hf_total
    assert model.active_parameter_count() == hf_total - inactive
    # the published one-decimal figures (Qwen's 3.3B active is 3.35B truncated, Mixtral's 12.9B is 12.88B rounded)
    assert abs(hf_total / 1e9 - total) < 0.06 and abs((hf_total - inactive) / 1e9 - active) < 0.06
    # matmul weights = active parameters less the embedding lookup and the norms: what FLOPs count
    norms = sum(p.numel() for n, p in hf_model.named_parameters() if "norm" in n)
    embedding = config["vocab_size"] * config["hidden_size"]
    matmul = hf_total - inactive - embedding - norms
    seq = 128
    attention = 12 * arch.n_layers * seq * seq * arch.attention.n_heads * arch.head_dim
    assert model.flops(seq) == 6 * seq * matmul + attention


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"architecture/moe/top_k": 9}, "architecture/moe/top_k=9 exceeds architecture/moe/n_experts=4"),
        ({"architecture/moe/capacity_factor": 0.0}, "architecture/moe/capacity_factor=0.0 must be positive"),
        ({"architecture/moe/capacity_factor": -1.0}, "architecture/moe/capacity_factor=-1.0 must be positive"),
    ],
)
def test_bad_mixture_keys_are_one_line(keys: dict[str, Any], message: str) -> None:
    from theseus.model.models import Mixtral

    with pytest.raises(ConfigError) as error:
        model = model_of(Mixtral, **keys)
        _ = model.architecture, model.scans_layers
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_mixture_key_on_a_dense_model_is_one_line() -> None:
    from theseus.model.models import Llama

    with pytest.raises(ConfigError) as error:
        model_of(Llama, **{"architecture/moe/n_experts": 8})
    assert str(error.value).startswith("unknown configuration key 'architecture/moe/n_experts'")
    assert "\n" not in str(error.value)


def test_routing_keys_left_unset_take_the_preset_s_and_set_ones_win() -> None:
    from theseus.model.models import DeepseekV3, Qwen3MoE

    preset = model_of(DeepseekV3).architecture.moe
    assert (preset.router, preset.n_shared, preset.first_k_dense, preset.n_group) == ("sigmoid", 1, 1, 2)
    assert preset.routed_scaling_factor == 2.5
    generic = {
        "architecture/moe/router": "softmax",
        "architecture/moe/n_shared": 0,
        "architecture/moe/n_group": 1,
        "architecture/moe/routed_scaling_factor": 1.0,
    }
    chosen = model_of(DeepseekV3, **generic).architecture.moe  # a key set to the generic default is honoured
    assert (chosen.router, chosen.n_shared, chosen.n_group, chosen.routed_scaling_factor) == ("softmax", 0, 1, 1.0)
    plain = model_of(Qwen3MoE).architecture.moe
    assert (plain.router, plain.n_shared, plain.first_k_dense, plain.n_group) == ("softmax", 0, 0, 1)


def test_first_dense_layers_are_dense_mlps() -> None:
    from theseus.model.models import Qwen3MoE

    model = model_of(Qwen3MoE, **{"architecture/moe/first_k_dense": 1})
    params = parameter_shapes(model)  # the structure alone: nothing compiled
    assert set(params["blocks_0"]["mlp"]) == {"up", "gate", "down"}
    assert set(params["blocks_1"]["mlp"]) == {"router", "up", "gate", "down"}
    arch = model.architecture
    dense, moe = 3 * arch.n_embd * arch.feed_forward.d_ff, arch.moe.active_matmul_params(arch.n_embd, True)
    first, second = model.layer_flops(8)  # the same attention; the feed-forwards differ
    assert second - first == 6 * 8 * (moe - dense)
    assert model.inactive_parameter_count() == (8 - 2) * 3 * 64 * 32 and not math.isnan(dense)


def test_the_train_step_loss_adds_the_sown_losses_and_validation_does_not() -> None:
    import optax

    from theseus.model.models import Mixtral
    from theseus.training import steps
    from theseus.training.state import TrainState

    model = model_of(Mixtral)
    x = jax.random.randint(jax.random.key(0), (2, 16), 0, 257)
    params = random_params(model, seed=1, std=0.02)  # the initialisers' scale, drawn with numpy: none compiled
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(0.1), model=model)
    batch = {"x": x, "y": x}
    _, plain = jitted(model.apply, {"params": params}, x, y=x, deterministic=True)
    _, trained, meta = jax.jit(lambda p: steps.forward(state, p, batch, deterministic=False))(params)
    _, validated, val_meta = jax.jit(lambda p: steps.forward(state, p, batch, deterministic=True))(params)
    rel = float32_tolerance(model_ops(model))  # separate programs of the model's forward pass
    assert float(trained) == pytest.approx(float(plain) + float(meta["aux_loss"]), rel=rel)
    assert float(validated) == pytest.approx(float(plain), rel=rel) and val_meta["aux_loss"] > 0
    # 2 layers x (0.01 x load balancing + 0.001 x z-loss), averaged over the layers
    expected = 0.01 * float(meta["moe_load_balancing_loss"]) + 0.001 * float(meta["moe_z_loss"])
    assert float(meta["aux_loss"]) == pytest.approx(expected, rel=1e-5)


def test_shared_experts_add_a_dense_mlp_every_token_passes_through() -> None:
    from theseus.model.layers.mlp import MLP

    x = jax.random.normal(jax.random.key(0), (2, 12, D))
    layer = MoE(n_experts=E, top_k=K, expert_hidden=F, n_shared=2)
    out, _, params = apply_layer(layer, x)
    unboxed = jax.tree.map(lambda v: getattr(v, "value", v), params, is_leaf=lambda v: hasattr(v, "value"))
    assert unboxed["shared"]["up"]["kernel"].shape == (D, 2 * F)
    tokens = x.reshape(-1, D)
    routing = route(tokens @ unboxed["router"], MoESpec(n_experts=E, top_k=K, expert_hidden=F))
    routed = loop_over_experts(tokens, routing, (unboxed["gate"], unboxed["up"], unboxed["down"]), SILU)
    shared = jitted(MLP(d_ff=2 * F, activation="swiglu", use_bias=False).apply, {"params": unboxed["shared"]}, x)
    assert float(jnp.max(jnp.abs(out - (routed.reshape(x.shape) + shared)))) <= 1e-5
    spec = MoESpec(n_experts=E, top_k=K, expert_hidden=F, n_shared=2)
    assert spec.active_matmul_params(D, True) == (K + 2) * 3 * D * F + D * E


def test_exports_refuse_what_the_checkpoints_cannot_express_in_one_line() -> None:
    from theseus.model.models import Mixtral, Qwen3MoE
    from theseus.model.models.mixtral.hf import MixtralFamily
    from theseus.model.models.qwen3_moe.hf import Qwen3MoEFamily

    cases = [
        (MixtralFamily(), Mixtral, {"architecture/moe/first_k_dense": 1}, "first_k_dense=1 (dense layers)"),
        (MixtralFamily(), Mixtral, {"architecture/moe/norm_topk_prob": False}, "norm_topk_prob=False"),
        (Qwen3MoEFamily(), Qwen3MoE, {"architecture/moe/n_shared": 1}, "n_shared=1 (shared experts)"),
        (Qwen3MoEFamily(), Qwen3MoE, {"architecture/moe/router": "sigmoid"}, "router=sigmoid"),
    ]
    for family, cls, keys, what in cases:
        with pytest.raises(ConfigError) as error:
            family.config(model_of(cls, **keys).architecture, {})
        assert what in str(error.value) and "cannot be exported" in str(error.value), str(error.value)


def gradient_temporaries(cls: type, n_layers: int, d_ff: int, **keys: Any) -> int:
    """Temporary bytes of the compiled gradient of a scanned ``cls``'s loss (shapes only: nothing allocated)."""
    shape = {
        "architecture/n_layers": n_layers,
        "architecture/n_embd": 128,
        "architecture/n_heads": 2,
        "architecture/n_kv_heads": 2,
        "architecture/d_ff": d_ff,
        "architecture/vocab_size": 64,
        "architecture/vocab_multiple": 64,
        "architecture/block_size": 16,
        "model/scan_layers": True,
    }
    model = model_of(cls, **shape, **keys)
    x = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), jnp.zeros((2, 16), jnp.int32))["params"]))

    def loss(p: Any, x: jax.Array) -> jax.Array:
        return model.apply({"params": p}, x, y=x, deterministic=True)[1]

    return int(jax.jit(jax.grad(loss)).lower(params, x).compile().memory_analysis().temp_size_in_bytes)


def test_a_scanned_mixture_keeps_no_more_per_layer_than_a_dense_model_of_its_size() -> None:
    """What the backward pass keeps per layer: the experts' activations (about ``top_k / n_experts`` of
    a dense MLP's of the same parameters) and never the weights as the blocks read them (one expert's
    slice per block, kept per layer: over four times the dense model's growth here)."""
    from theseus.model.models import Llama, Mixtral

    moe = {"architecture/moe/n_experts": 8, "architecture/moe/top_k": 2, "architecture/moe/dispatch": "blocks"}
    mixture = [gradient_temporaries(Mixtral, n, 256, **moe) for n in (2, 3)]
    dense = [gradient_temporaries(Llama, n, 8 * 256) for n in (2, 3)]
    assert mixture[1] - mixture[0] <= dense[1] - dense[0], (mixture, dense)


@pytest.mark.parametrize("exact", [True, False])
def test_gmm_rows_padded_to_a_row_tile_give_ragged_dots_values_and_gradients(exact: bool) -> None:
    """1,040 rows (past one 1,024-row tile and not a multiple of 256) are padded to 1,280 for the megablox
    kernel, whose padding rows it leaves unwritten both ways; whether the rows are masked (``exact=False``)
    or every row is a group's and the padding is only cut off after the kernel (``exact``, a dropless
    dispatch), values and gradients equal ``ragged_dot``'s and hold nothing but finite numbers."""
    from theseus.model.layers.experts import grouped_matmul

    m, k, n = 1040, 8, 8
    keys = jax.random.split(jax.random.key(7), 3)
    rows = jax.random.normal(keys[0], (m, k))
    kernel = jax.random.normal(keys[1], (3, k, n))
    sizes = jnp.asarray([500, 0, 540] if exact else [500, 0, 500], jnp.int32)
    cotangent = jax.random.normal(keys[2], (m, n))

    def run(path: str) -> Any:
        def loss(r: jax.Array, w: jax.Array) -> jax.Array:
            out = grouped_matmul(r, w, sizes, path, exact)
            return jnp.sum(out * cotangent), out

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(rows, kernel)

    (_, got), got_grads = run("gmm")
    (_, want), want_grads = run("ragged_dot")
    for a, b, ops in [(got, want, k), *((g, w, m) for g, w in zip(got_grads, want_grads, strict=True))]:
        assert bool(jnp.all(jnp.isfinite(a)))
        assert float(jnp.max(jnp.abs(a - b))) <= float32_tolerance(ops, float(jnp.max(jnp.abs(b))))


def masked_dense_reference(tokens: jax.Array, routing: Any, kernels: Any, kept: jax.Array | None) -> jax.Array:
    """Every expert on every token, each output weighted by the routing weight of the tokens that chose
    that expert (and were ``kept``): no sorting, gathering or grouping."""
    gate, up, down = kernels
    weights = routing.weights if kept is None else jnp.where(kept, routing.weights, 0.0)
    combine = jnp.sum(jax.nn.one_hot(routing.experts, E) * weights[..., None], axis=1)  # [N, E]
    hidden = SILU(jnp.einsum("nd,edf->enf", tokens, gate)) * jnp.einsum("nd,edf->enf", tokens, up)
    return jnp.einsum("end,ne->nd", jnp.einsum("enf,efd->end", hidden, down), combine)


@pytest.mark.parametrize("dispatch", ["ragged_dot", "gmm", "blocks", "capacity"])
def test_the_gather_dispatch_equals_a_masked_dense_reference_in_float32(dispatch: str) -> None:
    """The dispatch whose placements are gathers both ways (no scatter-add in the backward pass) and whose
    gate and up projections are one grouped matmul: outputs and gradients with respect to the tokens, the
    router and each expert weight equal a dense computation masked by the routing, in float32, within
    rounding of the operation count (a sum of ``D`` products, one of ``F``, ``k`` routed copies; a
    gradient's sums also run over the ``N`` tokens; :func:`tests.tolerances.float32_tolerance`)."""
    spec = MoESpec(n_experts=E, top_k=K, expert_hidden=F, capacity_factor=0.75 if dispatch == "capacity" else None)
    tokens, router, kernels = arrays(3)

    def output(which: str, tokens: jax.Array, router: jax.Array, kernels: Any) -> jax.Array:
        routing = route(tokens @ router, spec)
        if which == "reference":
            kept = (
                None
                if spec.capacity_factor is None
                else capacity_slots(routing.experts, E, expert_capacity(N, spec))[1]
            )
            return masked_dense_reference(tokens, routing, kernels, kept)
        if which == "capacity":
            return capacity_experts(tokens, routing, kernels, SILU, expert_capacity(N, spec))[0]
        return dropless_experts(tokens, routing, kernels, SILU, path=which)

    got = jax.jit(output, static_argnums=0)(dispatch, tokens, router, kernels)
    want = jax.jit(output, static_argnums=0)("reference", tokens, router, kernels)
    scale = float(jnp.max(jnp.abs(want)))
    forward = D + F + K  # the rounded operations behind one output
    assert float(jnp.max(jnp.abs(got - want))) <= float32_tolerance(forward, scale)

    def grads(which: str) -> Any:
        loss = lambda *a: jnp.sum(jnp.sin(output(which, *a)))  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(tokens, router, kernels)

    for g, r in zip(jax.tree.leaves(grads(dispatch)), jax.tree.leaves(grads("reference")), strict=True):
        # the backward pass about twice the forward's operations again, and a weight's sums over the tokens
        assert float(jnp.max(jnp.abs(g - r))) <= float32_tolerance(3 * forward + N, float(jnp.max(jnp.abs(r))))
        assert float(jnp.max(jnp.abs(r))) > 0


def test_auto_takes_the_megablox_kernels_on_a_tpu_only_where_they_can_tile_the_widths() -> None:
    """The kernels tile a width in multiples of 128 lanes (a tile of one width also tiles the other in the
    backward pass): the Mixtral shape's 768 x 2688 takes them; the tiny presets' 64 x 32 (which the TPU
    compiler refused) and a width of 200 take ``ragged_dot``; off a TPU ``auto`` takes the blocks."""
    from theseus.base.accelerator import Accelerator, targeting
    from theseus.model.layers.moe import auto_path

    with targeting(Accelerator("tpu", "TPU v5 lite")):
        assert auto_path(768, 2688) == "gmm"
        assert auto_path(64, 32) == auto_path(200, 256) == auto_path(256, 200) == "ragged_dot"
    with targeting(Accelerator("cpu", "cpu")):
        assert auto_path(768, 2688) == "blocks"
