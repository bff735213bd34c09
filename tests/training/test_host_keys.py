"""The trainer's keys, computed on the host, are bit for bit those of ``jax.random``."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np
import pytest

from theseus.training import keys


@pytest.fixture(params=[True, False], ids=["partitionable", "original"])
def threefry_layout(request: pytest.FixtureRequest) -> Iterator[bool]:
    before = jax.config.jax_threefry_partitionable  # type: ignore[attr-defined]
    jax.config.update("jax_threefry_partitionable", request.param)
    yield request.param
    jax.config.update("jax_threefry_partitionable", before)


@pytest.mark.parametrize("seed", [0, 1, 42, 123_456_789, 2**31 - 1])
def test_root_and_step_keys_equal_jax_random(threefry_layout: bool, seed: int) -> None:
    assert keys.host_keys_supported()
    init_key, dropout_key = keys.root_keys(seed)
    expected = jax.random.split(jax.random.PRNGKey(seed))
    np.testing.assert_array_equal(np.asarray(init_key), np.asarray(expected[0]))
    np.testing.assert_array_equal(np.asarray(dropout_key), np.asarray(expected[1]))
    for step in (0, 1, 7, 1000, 2**32 - 1):
        np.testing.assert_array_equal(
            np.asarray(keys.step_key(dropout_key, step)), np.asarray(jax.random.fold_in(expected[1], step))
        )
    np.testing.assert_array_equal(keys.split(np.asarray(init_key), 5), np.asarray(jax.random.split(expected[0], 5)))


def test_other_generators_go_through_jax_random() -> None:
    before = jax.config.jax_default_prng_impl  # type: ignore[attr-defined]
    jax.config.update("jax_default_prng_impl", "rbg")
    try:
        assert not keys.host_keys_supported()
        init_key, dropout_key = keys.root_keys(3)
        expected = jax.random.split(jax.random.PRNGKey(3))
        assert init_key.shape == (4,)  # rbg keys have four words
        np.testing.assert_array_equal(np.asarray(dropout_key), np.asarray(expected[1]))
        np.testing.assert_array_equal(
            np.asarray(keys.step_key(dropout_key, 5)), np.asarray(jax.random.fold_in(expected[1], 5))
        )
    finally:
        jax.config.update("jax_default_prng_impl", before)
