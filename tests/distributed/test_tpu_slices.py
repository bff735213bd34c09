"""Meshes on multi-host TPU slices: jax lays the mesh's axes along the slice's torus, which can give a host
every other data position; each host must still feed one contiguous share of every batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from theseus.base.axis import ShardingPlan
from theseus.training.sharding import build_sharding, data_feed


@dataclass(frozen=True)
class Chip:
    """What jax's mesh utilities read of a TPU device."""

    id: int
    coords: tuple[int, int, int]
    process_index: int
    platform: str = "tpu"
    device_kind: str = "TPU v5"
    core_on_chip: int = 0
    slice_index: int = 0


def test_hosts_of_a_v5p_slice_feed_contiguous_shares() -> None:
    """v5p:2x2x2: two hosts of 2x2x1 chips. Along the torus jax's own order gives the hosts the data
    positions [0, 2, 4, 6] and [1, 3, 5, 7]; the mesh instead keeps each host's chips in one block."""
    chips = [Chip(i, (i % 2, i // 2 % 2, i // 4), process_index=i // 4) for i in range(8)]
    sharding = build_sharding(ShardingPlan(), layout="fsdp", devices=chips)
    assert [data_feed(sharding.mesh, process) for process in (0, 1)] == [(0, 2), (1, 2)]
    hosts = np.vectorize(lambda chip: chip.process_index)(sharding.mesh.devices)
    assert hosts.ravel().tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
