"""``rl/pack``: a step's prompt + completion rows packed with segment ids for the policy, reference and
old-policy passes give the per-token log-probabilities, the loss and the gradients of the padded rows."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import TINY_GPT
from theseus.model.rl.rollouts import Rollouts
from theseus.training import packing

#: float32's machine epsilon: the tolerances below are it times the additions behind one value.
EPS = float(np.finfo(np.float32).eps)


def padded_rows(lengths: list[int], width: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Right-padded rows of ``lengths`` random tokens."""
    rng = np.random.default_rng(seed)
    x = np.zeros((len(lengths), width), np.int32)
    real = np.zeros((len(lengths), width), bool)
    for i, n in enumerate(lengths):
        x[i, :n], real[i, :n] = rng.integers(1, 50, n), True
    return {"x": x, "y": x + 1, "padding_mask": real}


def test_rows_are_packed_first_fit_decreasing_and_gathered_back() -> None:
    assert packing.first_fit_decreasing([5, 9, 3, 6, 2], 10) == [[1], [2, 3], [0, 4]]
    batch = padded_rows([5, 9, 3, 6, 2, 10, 1, 4], 10)
    packed = packing.pack(batch)
    e = packed.entries
    assert packed.rows == e[packing.PACKED_X].shape[0] == 4  # 40 tokens in rows of 10
    assert packed.fill == 1.0
    segments = e[packing.PACKED_SEGMENTS]
    for name, packed_name in (("x", packing.PACKED_X), ("y", packing.PACKED_Y)):
        back = np.asarray(packing.unpack(jnp.asarray(e[packed_name]), e))
        np.testing.assert_array_equal(back, np.where(batch["padding_mask"], batch[name], 0))
    assert np.all(e[packing.PACKED_Y][segments == 0] == -1)  # packed padding is never a target
    # each process's share packed apart, into as many rows as the fullest share needs (a multiple of its devices)
    two = packing.pack(batch, shares=2, multiple=2).entries
    assert two[packing.PACKED_X].shape[0] == 8
    shared = [packing.share({**batch, **two}, k, 2) for k in range(2)]
    assert all(s[packing.PACKED_X].shape[0] == 4 and s["x"].shape[0] == 4 for s in shared)
    back = np.asarray(packing.unpack(jnp.asarray(two[packing.PACKED_X]), two))
    np.testing.assert_array_equal(back, np.where(batch["padding_mask"], batch["x"], 0))
    # the row counts a run compiles for: steps of an eighth of the rows, a multiple of the devices
    assert [packing.packed_row_count(n, 64, 2) for n in (1, 8, 9, 63)] == [8, 8, 16, 64]
    left = {**batch, "padding_mask": batch["padding_mask"][:, ::-1]}
    with pytest.raises(ValueError, match="right-padded"):
        packing.pack(left)


#: A one-layer GPT scoring rows of 64 tokens; full fine-tuning with a KL penalty (a copied reference) and
#: two updates per rollout (the old policy's pass).
SETTINGS = [
    *TINY_GPT,
    "architecture/block_size=64",
    "training/sequence_length=64",
    "architecture/vocab_size=257",
    "training/batch_size=16",
    "rl/group_size=4",
    "rl/max_new_tokens=48",
    "rl/beta=0.1",
    "rl/updates_per_rollout=2",
    "rl/pack=true",
    "environment=letters",
]


def rollouts(rows: int, seed: int = 0) -> Rollouts:
    """Scored rollouts of spread lengths (the flows' short prompts and 4-64 token completions, in rows of 64):
    prompts of 3-8 tokens, completions of 4-48."""
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(1, 256, int(rng.integers(3, 9)))) for _ in range(rows // 4) for _ in range(4)]
    completions = [list(rng.integers(1, 256, int(rng.integers(4, 49)))) for _ in range(rows)]
    rewards = [float(r) for r in rng.random(rows)]
    return Rollouts(prompts, completions, [True] * rows, rewards, {"letters": rewards})


def test_packed_passes_give_the_padded_log_probabilities_loss_and_gradients(tmp_path: Path) -> None:
    import tests.rl.letters_env  # noqa: F401  (registers environment/letters in this process, as --load does)
    from theseus.model.rl.reference import REF_LOGPS
    from theseus.model.rl.rollout_source import Sampled
    from theseus.model.rl.trainer import GRPOTrainer
    from theseus.training import steps

    trainer = GRPOTrainer.create(tmp_path, SETTINGS)
    assert isinstance(trainer, GRPOTrainer)
    trainer.setup()
    state = trainer.state = trainer.init_state()
    rows = trainer.rollout_rows(Sampled(rollouts(16), 0.0, 0), 0)  # packed, the reference's pass included
    padded = {k: v for k, v in rows.items() if k not in (*packing.PACKED_ROWS, packing.PACKED_INDEX)}
    real = int(rows["padding_mask"].sum())
    assert rows["pack_rows"][0] < 16 and rows["pack_fill"][0] == pytest.approx(real / (rows["pack_rows"][0] * 64))

    # a log-probability sums over n_embd in a projection, up to 64 keys in attention and 257 ids in the softmax
    additions = 32 + 64 + 257
    packed_batch = trainer.device_train_batch(rows)
    padded_batch = trainer.device_train_batch(padded)  # the same reference log-probabilities
    objective, cls = trainer.objective(), type(trainer)
    old = [steps.old_policy_logps(state, b, trainer.sharding) for b in (packed_batch, padded_batch)]
    atol = EPS * additions * float(jnp.abs(old[1]).max())
    np.testing.assert_allclose(old[0], old[1], rtol=0, atol=atol)
    # before any update the reference (the initial parameters) scores as the policy does
    np.testing.assert_allclose(rows[REF_LOGPS], old[1][0], rtol=0, atol=atol)

    # the loss and gradients of one update, against old-policy log-probabilities some way off (clipping acts)
    shift = jnp.asarray(np.random.default_rng(1).normal(0.0, 0.3, old[1].shape), jnp.float32)

    def loss_and_grads(batch: dict) -> tuple:
        micro = jax.tree.map(lambda a: a[0], {**batch, "old_logps": old[1] + shift})

        def loss(params: object) -> tuple:
            return steps.objective_loss(cls, objective, state, params, micro, jax.random.key(0), False)

        with trainer.sharding.context():
            return jax.jit(jax.value_and_grad(loss, has_aux=True))(state.params)

    (loss_packed, metrics), grads_packed = loss_and_grads(packed_batch)
    (loss_padded, padded_metrics), grads_padded = loss_and_grads(padded_batch)
    assert float(loss_padded) != 0.0 and float(metrics["clip_ratio/region_mean"]) > 0
    assert float(metrics["pack_fill"]) == pytest.approx(float(rows["pack_fill"][0]))
    for name in ("entropy", "kl", "ratio_mean", "clip_ratio/region_mean"):  # the policy's entropy: its own pass
        np.testing.assert_allclose(metrics[name], padded_metrics[name], rtol=EPS * additions, err_msg=name)
    # the loss and each gradient sum over the batch's real tokens
    np.testing.assert_allclose(loss_packed, loss_padded, rtol=EPS * real, atol=0)
    for a, b in zip(jax.tree.leaves(grads_packed), jax.tree.leaves(grads_padded), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=EPS * real * float(jnp.abs(b).max()) + 1e-12)
    trainer.close()
