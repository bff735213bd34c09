"""Packed rows: first-fit placement with segment ids, positions per example, and losses equal to
the same examples unpacked, with no attention across example boundaries."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.data.conftest import write_prepared
from tests.models.conftest import build, jitted, random_params
from theseus.model.models import GPT, Llama, TransformerLM, token_positions
from theseus.training.flywheel import Flywheel


def _docs(count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.integers(1, 60, size=int(rng.integers(2, 9)))) for _ in range(count)]


def test_packed_rows_hold_whole_examples_with_segment_ids(tmp_path: Path) -> None:
    docs = _docs(40)
    prompts = [2 if i % 2 else 0 for i in range(len(docs))]  # odd documents: two prompt tokens
    write_prepared(tmp_path, "short", {"train": docs}, vocab_size=64, prompts={"train": prompts}, style="packed")
    with Flywheel("short", root=tmp_path, block_size=16, batch_size=4, seed=3, prefetch=0) as wheel:
        batch = wheel.batch(0)
        again = wheel.batch(0)
    for key in ("x", "y", "padding_mask"):
        np.testing.assert_array_equal(batch[key], again[key])
    seg = batch["padding_mask"]
    assert seg.dtype == np.int32
    eot = 63
    examples = {tuple([*d, eot]) for d in docs}
    for r in range(seg.shape[0]):
        ids = seg[r]
        assert ids.max() >= 2, "short examples share a row"
        real = ids > 0
        assert np.all(np.diff(ids[real]) >= 0) and not np.any(real[np.argmin(real) :] if not real.all() else [])
        for k in range(1, ids.max() + 1):
            where = np.flatnonzero(ids == k)
            assert np.all(np.diff(where) == 1), "an example occupies consecutive positions"
            x, y = batch["x"][r, where], batch["y"][r, where]
            sequence = (*x.tolist(), eot)
            assert sequence in examples, "each segment is one whole document"
            doc = next(d for d in docs if tuple([*d, eot]) == sequence)
            expected = [*doc[1:], eot]
            if prompts[docs.index(doc)]:
                expected[0] = -1  # the second prompt token is not a target
            assert y.tolist() == expected
        assert np.all(batch["y"][r, ~real] == -1)
    padding = 1 - (seg > 0).mean()
    assert padding < 0.3


def test_packed_rows_do_not_depend_on_the_process_count(tmp_path: Path) -> None:
    """Each packed row comes from its own seed: any process count and micro-batching builds the same rows."""
    from theseus.training.flywheel import Sampling

    write_prepared(tmp_path, "short", {"train": _docs(40)}, vocab_size=64, style="packed")
    write_prepared(tmp_path, "long", {"train": [list(range(1, 60))] * 3}, vocab_size=64)
    mix = [Sampling("short", 0.7, "packed"), Sampling("long", 0.3, "pmd")]

    def share(process: int, processes: int, micro: int) -> dict[str, np.ndarray]:
        with Flywheel(
            mix,
            root=tmp_path,
            block_size=16,
            batch_size=8,
            seed=4,
            process_index=process,
            process_count=processes,
            micro_batches=micro,
            prefetch=0,
        ) as wheel:
            return {"rows": wheel.rows, **wheel.batch(2)}

    whole = share(0, 1, 1)
    seg = whole["padding_mask"]
    assert seg.dtype == np.int32
    assert (seg.max(axis=1) >= 2).any() and (seg == 1).all(axis=1).any()  # packed rows and pmd windows
    for processes, micro in ((2, 1), (4, 1), (2, 2)):
        parts = [share(p, processes, micro) for p in range(processes)]
        assert sorted(np.concatenate([part["rows"] for part in parts]).tolist()) == list(range(8))
        for part in parts:
            for key in ("x", "y", "padding_mask"):
                np.testing.assert_array_equal(part[key], whole[key][part["rows"]])


def test_positions_restart_per_segment() -> None:
    seg = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0]], jnp.int32)
    assert token_positions(seg).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]
    assert token_positions(jnp.asarray([[True, True, False]])).tolist() == [[0, 1, 1]]


def _pack(examples: list[np.ndarray], length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.zeros((1, length), np.int32)
    y = np.full((1, length), -1, np.int32)
    seg = np.zeros((1, length), np.int32)
    at = 0
    for k, ex in enumerate(examples, start=1):
        n = ex.size - 1
        x[0, at : at + n], y[0, at : at + n], seg[0, at : at + n] = ex[:-1], ex[1:], k
        at += n
    return x, y, seg


@pytest.mark.parametrize("cls", [GPT, Llama], ids=["gpt", "llama"])
def test_packed_loss_equals_unpacked_and_examples_do_not_see_each_other(cls: type[TransformerLM]) -> None:
    model = build(cls)
    params = random_params(model)
    apply = jax.jit(lambda p, x, y, m: model.apply({"params": p}, x, y=y, padding_mask=m, deterministic=True))
    rng = np.random.default_rng(0)
    examples = [rng.integers(0, 64, size=n).astype(np.int32) for n in (7, 11, 5, 6)]
    length = 32
    x, y, seg = _pack(examples, length)
    logits, loss = apply(params, x, y, seg)

    rows = np.zeros((len(examples), length), np.int32)
    targets = np.full((len(examples), length), -1, np.int32)
    mask = np.zeros((len(examples), length), bool)
    for i, ex in enumerate(examples):
        n = ex.size - 1
        rows[i, :n], targets[i, :n], mask[i, :n] = ex[:-1], ex[1:], True
    alone, unpacked = apply(params, rows, targets, mask)
    assert abs(float(loss) - float(unpacked)) <= 1e-5
    at = 0
    for i, ex in enumerate(examples):
        n = ex.size - 1
        np.testing.assert_allclose(logits[0, at : at + n], alone[i, :n], atol=1e-5, rtol=1e-5)
        at += n

    changed = [examples[0], rng.integers(0, 64, size=11).astype(np.int32), *examples[2:]]
    x2, y2, seg2 = _pack(changed, length)
    logits2, _ = apply(params, x2, y2, seg2)
    keep = (seg[0] != 2) & (seg[0] > 0)
    np.testing.assert_array_equal(np.asarray(logits2[0, keep]), np.asarray(logits[0, keep]))
    assert not np.allclose(logits2[0, seg[0] == 2], logits[0, seg[0] == 2])


def test_long_packed_rows_use_the_blocked_path_with_segment_masks() -> None:
    """At 256+ positions causal attention runs in query blocks; segment masks must survive that."""
    from theseus.model.layers import attention_mask, dot_product_attention

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 256, 2, 8)), jnp.float32) for _ in range(3))
    seg = jnp.asarray(np.repeat(np.arange(1, 5), [100, 60, 90, 6])[None], jnp.int32)
    mask = attention_mask(seg)
    assert mask is not None
    blocked = jitted(dot_product_attention, q, k, v, mask=mask, is_causal=True, implementation="xla")
    causal = jnp.tril(jnp.ones((256, 256), bool))[None, None]
    direct = jitted(jax.nn.dot_product_attention, q, k, v, mask=mask & causal, implementation="xla")
    np.testing.assert_allclose(np.asarray(blocked), np.asarray(direct), atol=1e-5)
    alone = jax.nn.dot_product_attention(q[:, 100:160], k[:, 100:160], v[:, 100:160], is_causal=True)
    np.testing.assert_allclose(np.asarray(blocked[:, 100:160]), np.asarray(alone), atol=1e-5)
