"""``training/precision=fp8`` on CPU (FP8 emulated by XLA): the projection and its gradient against
float32, a small GPT's loss over 200 steps against bfloat16, and a resume that is bit-exact."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import TINY_GPT
from tests.reliability.conftest import call_cli
from tests.training.conftest import write_byte_corpus

#: A GPT small enough for 200 CPU steps in seconds, with bfloat16 activations (what FP8 replaces on GPUs).
SMALL = [
    *TINY_GPT,
    "training/log_interval=1",
    "training/eval_batches=0",
    "training/progress=false",
    "training/peak_flops=1e12",
    "model/activation_dtype=bfloat16",
]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fp8-root")
    write_byte_corpus(folder, "fineweb", documents=256)
    return folder


def train(root: Path, name: str, *overrides: str) -> Path:
    args = ["run", "train/pretrain", *SMALL, *overrides, f"run/name={name}", "--root", str(root)]
    assert call_cli(args) == 0
    return root / "runs" / name


def train_losses(run: Path) -> np.ndarray:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return np.array([row["loss"] for row in rows if row["split"] == "train"])


def test_the_fp8_projection_and_its_gradient_against_float32() -> None:
    from theseus.model.layers.matmul import fp8_einsum

    k1, k2 = jax.random.split(jax.random.key(0))
    x, w = jax.random.normal(k1, (4, 8, 64)), jax.random.normal(k2, (64, 3, 16)) * 0.05
    equation = "bte,enh->btnh"

    def relative(a: jax.Array, b: jax.Array) -> float:
        return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))

    # e4m3 keeps 3 mantissa bits: about 2.5 % per rounded value, 4 % for a product of two
    assert relative(fp8_einsum(equation, x, w), jnp.einsum(equation, x, w)) < 0.05
    loss = lambda f: lambda a, b: jnp.sum(jnp.sin(f(a, b)))  # noqa: E731
    exact = jax.grad(loss(lambda a, b: jnp.einsum(equation, a, b)), argnums=(0, 1))(x, w)
    fp8 = jax.grad(loss(lambda a, b: fp8_einsum(equation, a, b)), argnums=(0, 1))(x, w)
    assert all(relative(g, e) < 0.06 for g, e in zip(fp8, exact, strict=True))
    backward = str(jax.make_jaxpr(jax.grad(loss(lambda a, b: fp8_einsum(equation, a, b))))(x, w))
    assert "f8_e5m2" in backward and "f8_e4m3fn" in backward  # gradients e5m2, operands e4m3


def test_fp8_training_tracks_bfloat16_over_200_steps(root: Path) -> None:
    bf16 = train_losses(train(root, "bf16", "training/steps=200"))
    fp8 = train_losses(train(root, "fp8", "training/steps=200", "training/precision=fp8"))
    assert len(bf16) == len(fp8) == 200
    assert not list((root / "runs" / "bf16").glob("*.png"))  # training/plots=false (TINY_GPT's) draws none
    assert not np.array_equal(bf16, fp8)  # the projections did run in FP8
    # e4m3/e5m2 rounding moves single steps by well under 1 %; the curves stay together
    assert np.max(np.abs(fp8 - bf16) / bf16) < 0.01, np.max(np.abs(fp8 - bf16) / bf16)
    assert abs(fp8[-20:].mean() - bf16[-20:].mean()) / bf16[-20:].mean() < 0.005
    assert fp8[-20:].mean() < 0.75 * fp8[:5].mean()  # and it learned


def checkpoint_digest(run: Path, step: int) -> str:
    """sha256 over the arrays of a checkpoint's parameters and optimizer state."""
    import orbax.checkpoint as ocp

    from theseus.checkpoint import CheckpointStore
    from theseus.checkpoint.store import STATE, ChecksummedRestore

    store = CheckpointStore(run / "checkpoints", async_save=False)
    try:
        restored = store.manager.restore(step, args=ocp.args.Composite(**{STATE: ChecksummedRestore()}))[STATE]
    finally:
        store.close()
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves({"params": restored["params"], "opt_state": restored["opt_state"]}):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()


def test_an_interrupted_fp8_run_resumes_bit_exactly(root: Path) -> None:
    once = train(root, "whole", "training/steps=6", "training/precision=fp8")
    twice = train(root, "halves", "training/steps=6", "training/precision=fp8", "training/stop_after=3")
    train(root, "halves", "training/steps=6", "training/precision=fp8")
    assert checkpoint_digest(once, 6) == checkpoint_digest(twice, 6)
