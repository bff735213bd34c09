"""Joining a multi-process run (options, environment, cluster detection) and who feeds which rows."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import numpy as np
import pytest

from theseus.base.distributed import DistributedSetup, detected_cluster, initialize, requested
from theseus.cli.main import main
from theseus.errors import ConfigError
from theseus.training.sharding import feed_share

SLURM = {
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
}
LAUNCHERS = ["OMPI_MCA_orte_hnp_uri", "KUBERNETES_SERVICE_HOST", "TPU_WORKER_HOSTNAMES", "THESEUS_DISTRIBUTED"]
LAUNCHERS += ["THESEUS_COORDINATOR", "THESEUS_NUM_PROCESSES", "THESEUS_PROCESS_ID"]


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment without any launcher's variables."""
    for name in [*SLURM, "SLURM_NTASKS", *LAUNCHERS]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_nothing_requested_on_a_plain_machine(plain: pytest.MonkeyPatch) -> None:
    assert requested(environ={}) is None
    assert detected_cluster() is None
    import jax

    assert initialize() is None
    assert not jax.distributed.is_initialized()


def test_options_and_environment_variables() -> None:
    env = {"THESEUS_COORDINATOR": "10.0.0.1:1234", "THESEUS_NUM_PROCESSES": "4", "THESEUS_PROCESS_ID": "3"}
    assert requested(environ=env) == DistributedSetup("10.0.0.1:1234", 4, 3, "environment")
    assert requested("host:9", 2, 0, environ=env) == DistributedSetup("host:9", 2, 0, "options")


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("h:1", None, None), {}, "missing --num-processes, --process-id"),
        ((None, 2, 0), {}, "missing --coordinator"),
        (("h:1", 2, 2), {}, "--process-id must lie in [0, 2) for --num-processes 2, got 2"),
        (("h", 2, 0), {}, "--coordinator must be host:port of process 0"),
        ((None, None, None), {"THESEUS_NUM_PROCESSES": "two"}, "THESEUS_NUM_PROCESSES must be an integer"),
    ],
)
def test_incomplete_or_wrong_settings_are_one_line_errors(args: tuple, env: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        requested(*args, environ=env)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_coordinator_problems_are_one_line_errors_not_aborts(plain: pytest.MonkeyPatch) -> None:
    import jax

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"process 0 cannot serve the coordinator on port {port}"):
            initialize(f"127.0.0.1:{port}", 2, 0)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(ConfigError, match=f"process 1 cannot reach the coordinator 127.0.0.1:{port} after 0.5 s"):
        initialize(f"127.0.0.1:{port}", 2, 1, timeout=0.5)
    assert not jax.distributed.is_initialized()


def test_cluster_detection_needs_more_than_one_launched_process(plain: pytest.MonkeyPatch) -> None:
    for name, value in SLURM.items():
        plain.setenv(name, value)
    plain.setenv("SLURM_NTASKS", "1")  # a single-task allocation is a plain run
    assert detected_cluster() is None
    plain.setenv("SLURM_NTASKS", "2")
    assert detected_cluster() == "slurm"
    plain.setenv("THESEUS_DISTRIBUTED", "off")
    assert detected_cluster() is None


def test_cli_reports_incomplete_options(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "any/job", "--coordinator", "127.0.0.1:4000"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: a multi-process run needs --coordinator, --num-processes and --process-id")
    assert "\n" not in err


def devices(*processes: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(process_index=p) for p in processes]


def test_feed_share_follows_the_data_positions_of_each_process() -> None:
    # 2 processes x 2 devices along data: each feeds half of every batch.
    data_only: np.ndarray = np.array(devices(0, 0, 1, 1)).reshape(4, 1)
    assert [feed_share(data_only, 0, p) for p in (0, 1)] == [(0, 2), (1, 2)]
    # data x model = 2 x 2 with each process holding one data row.
    mixed: np.ndarray = np.array(devices(0, 0, 1, 1)).reshape(2, 2)
    assert [feed_share(mixed, 0, p) for p in (0, 1)] == [(0, 2), (1, 2)]
    # The model axis spans the processes: both feed the same (whole) batch.
    model_only: np.ndarray = np.array(devices(0, 0, 1, 1)).reshape(1, 4)
    assert [feed_share(model_only, 0, p) for p in (0, 1)] == [(0, 1), (0, 1)]
    # Processes interleaved along data cannot each feed one contiguous share.
    with pytest.raises(ConfigError, match="one contiguous block of data positions"):
        feed_share(np.array(devices(0, 1, 0, 1)).reshape(4, 1), 0, 0)


def test_feed_share_counts_expert_and_data_positions_together() -> None:
    # expert x data x model = 2 x 2 x 1 over 2 processes of 2 devices: batch rows split over expert x data
    # (expert-major), each process holds one expert position and both data positions, so one half.
    grid: np.ndarray = np.array(devices(0, 0, 1, 1)).reshape(2, 2, 1)
    assert [feed_share(grid, (0, 1), p) for p in (0, 1)] == [(0, 2), (1, 2)]
    # 4 processes of one device each: a quarter each, in expert-major order.
    quarters: np.ndarray = np.array(devices(0, 1, 2, 3)).reshape(2, 2, 1)
    assert [feed_share(quarters, (0, 1), p) for p in range(4)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    # Processes split along data but sharing expert positions hold interleaved rows: refused.
    with pytest.raises(ConfigError, match="one contiguous block of data positions"):
        feed_share(np.array(devices(0, 1, 0, 1)).reshape(2, 2, 1), (0, 1), 0)
