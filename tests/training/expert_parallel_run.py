"""Subprocess of the expert-parallel tests (8 simulated devices, most checks on the first 4; XLA_FLAGS
set before jax starts).

``python expert_parallel_run.py ROOT OUT.json`` records:

* ``layer``: the all-to-all expert paths on 4 devices against the loop over experts on the same
  arrays, forward and gradients, dropless and with a capacity;
* ``runs``: a tiny Qwen3-MoE trained 5 steps on one device, in the ep (expert 4), fsdp+ep
  (expert 2 x data 2) and tp+ep (expert 2 x model 2) layouts on 4 devices, and in fsdp+tp+ep
  (expert 2 x data 2 x model 2) on 8: losses, mesh, expert-weight shardings and the bytes of expert
  weights per device;
* ``resumed``: the ep run's checkpoint of step 3 resumed on one device to step 5;
* ``errors``: the one-line ConfigError of each of ``MISTAKES`` (setup only).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from jax.sharding import AxisType, NamedSharding, PartitionSpec

from tests.distributed.settings import setup_errors
from theseus.model.layers._common import ACTIVATIONS
from theseus.model.layers.expert_parallel import parallel_capacity_experts, parallel_dropless_experts
from theseus.model.layers.experts import capacity_slots, loop_over_experts
from theseus.model.layers.moe import MoESpec, expert_capacity, route
from theseus.training.pretrain import Pretrain

#: 1 layer of 4 experts (top 2) at width 32 (the expert-parallel paths are per layer: a second one only
#: doubled what each layout traces and compiles); 8 rows of 32 bytes a step, a checkpoint at the end of each
#: invocation only (and the ep run's of step 3, the one a resume reads).
ARGS = {
    "model": "qwen3_moe",
    "architecture/n_layers": 1,
    "architecture/n_embd": 32,
    "architecture/n_heads": 2,
    "architecture/n_kv_heads": 2,
    "architecture/head_dim": 16,
    "architecture/block_size": 32,
    "architecture/moe/n_experts": 4,
    "architecture/moe/expert_hidden": 16,
    "architecture/moe/aux_loss": 0.1,
    "training/batch_size": 8,
    "training/steps": 5,
    "training/lr": 3e-3,
    "training/log_interval": 1,
    "training/eval_batches": 0,
    "training/checkpoint_interval": 1000,
    "training/async_checkpoints": False,
    "training/progress": False,
    "training/compilation_cache": False,
    "training/peak_flops": 1e12,
    "evaluation": "",
}
LAYOUTS = {
    "ep": {"mesh/layout": "ep", "mesh/expert": 4, "training/checkpoint_interval": 3},
    "fsdp+ep": {"mesh/layout": "fsdp+ep", "mesh/expert": 2, "mesh/data": 2},
    "tp+ep": {"mesh/layout": "tp+ep", "mesh/expert": 2, "mesh/data": 1, "mesh/model": 2},
}
#: On all 8 devices: the experts split over expert and model, and their width over data.
EIGHT = {"fsdp+tp+ep": {"mesh/layout": "fsdp+tp+ep", "mesh/expert": 2, "mesh/data": 2, "mesh/model": 2}}

#: Settings that cannot work on 4 devices.
MISTAKES = {
    "experts": {"mesh/layout": "ep", "mesh/expert": 4, "architecture/moe/n_experts": 6},
    "layout": {"mesh/layout": "fsdp", "mesh/expert": 2},
    "devices": {"mesh/layout": "ep", "mesh/expert": 3},
}


class OneDevice(Pretrain):
    def mesh_devices(self) -> list[Any]:
        return list(jax.devices())[:1]


class FourDevices(Pretrain):
    def mesh_devices(self) -> list[Any]:
        return list(jax.devices())[:4]


def losses(root: Path, run: str) -> dict[str, list[float]]:
    rows = [json.loads(line) for line in (root / "runs" / run / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if row.get("split") == "train"]
    return {
        "steps": [row["step"] for row in train],
        "loss": [row["loss"] for row in train],
        "aux_loss": [row["aux_loss"] for row in train],
        "moe_tokens_max": [row["moe_tokens_max"] for row in train],
    }


def layer_checks() -> dict[str, float]:
    """Largest differences of the expert-parallel paths from the loop reference."""
    mesh = jax.make_mesh((4,), ("expert",), axis_types=(AxisType.Auto,), devices=jax.devices()[:4])
    n, d, f, e = 32, 16, 12, 8
    keys = jax.random.split(jax.random.key(0), 5)
    tokens = jax.random.normal(keys[0], (n, d))
    router = jax.random.normal(keys[1], (d, e))
    kernels = tuple(
        0.3 * jax.random.normal(k, s) for k, s in zip(keys[2:], [(e, d, f), (e, d, f), (e, f, d)], strict=True)
    )
    act = ACTIVATIONS["swiglu"]
    rows = NamedSharding(mesh, PartitionSpec("expert"))
    out: dict[str, float] = {}
    for name, factor in (("dropless", None), ("capacity", 0.75)):
        spec = MoESpec(n_experts=e, top_k=2, expert_hidden=f, capacity_factor=factor)
        capacity = expert_capacity(n, spec) if factor else 0

        def parallel(x: jax.Array, kern: Any, spec: MoESpec = spec, capacity: int = capacity) -> jax.Array:
            routing = route(x @ router, spec)
            if spec.capacity_factor is None:
                return parallel_dropless_experts(x, routing, kern, act, 4, path="blocks")
            return parallel_capacity_experts(x, routing, kern, act, capacity, 4)[0]

        def reference(x: jax.Array, kern: Any, spec: MoESpec = spec, capacity: int = capacity) -> jax.Array:
            routing = route(x @ router, spec)
            kept = None if spec.capacity_factor is None else capacity_slots(routing.experts, e, capacity)[1]
            return loop_over_experts(x, routing, kern, act, kept)

        placed = jax.device_put(tokens, rows), jax.device_put(kernels, rows)
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            got = jax.jit(parallel)(*placed)
            grads = jax.jit(jax.grad(lambda x, k: jnp.sum(jnp.sin(parallel(x, k))), argnums=(0, 1)))(*placed)
        want = jax.jit(reference)(tokens, kernels)
        want_grads = jax.jit(jax.grad(lambda x, k: jnp.sum(jnp.sin(reference(x, k))), argnums=(0, 1)))(tokens, kernels)
        out[f"{name}_forward"] = float(jnp.max(jnp.abs(got - want)))
        out[f"{name}_grad"] = max(
            float(jnp.max(jnp.abs(a - b)))
            for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True)
        )
        out[f"{name}_scale"] = float(jnp.max(jnp.abs(want)))
    return out


def expert_bytes(trainer: Pretrain) -> tuple[int, list[Any]]:
    """Bytes of the routed experts' weights on the first device, and the spec of one of them."""
    assert trainer.state is not None
    first = jax.devices()[0]
    held, spec = 0, None
    for path, leaf in jax.tree_util.tree_flatten_with_path(trainer.state.params)[0]:
        names = [str(getattr(p, "key", p)) for p in path]
        if names[-1] in ("gate", "up", "down") and "mlp" in names:
            held += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == first)
            spec = [list(a) if isinstance(a, tuple) else a for a in leaf.sharding.spec]
    return held, spec


def main() -> None:
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    results: dict[str, Any] = {"device_count": jax.device_count(), "layer": layer_checks(), "runs": {}}
    runs = [
        ("single", OneDevice, {}),
        *((n, FourDevices, x) for n, x in LAYOUTS.items()),
        *((n, Pretrain, x) for n, x in EIGHT.items()),
    ]
    for name, cls, extra in runs:
        trainer = cls.create(root, {**ARGS, **extra, "run/name": name})
        trainer.run()
        held, spec = expert_bytes(trainer)
        results["runs"][name] = {
            "losses": losses(root, name),
            "mesh": dict(trainer.sharding.mesh.shape),
            "expert_bytes": held,
            "expert_spec": spec,
        }
    # the ep run's own step-3 checkpoint (its losses are recorded above): steps 4 and 5 now from one device
    OneDevice.create(root, {**ARGS, "run/name": "ep", "training/resume_step": 3}).run()
    results["resumed"] = losses(root, "ep")
    results["errors"] = setup_errors(FourDevices, root, ARGS, MISTAKES)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
