"""Joining a multi-process run: ``jax.distributed.initialize`` from options, env vars or the cluster.

``theseus run`` calls :func:`initialize` before the job touches a device. A run is
multi-process when ``--coordinator/--num-processes/--process-id`` (or the environment
variables ``THESEUS_COORDINATOR``, ``THESEUS_NUM_PROCESSES``, ``THESEUS_PROCESS_ID``) are
given, or when a cluster launcher that jax recognises (SLURM, Open MPI, Cloud TPU, Kubernetes)
started more than one process. A plain single-machine run initialises nothing.
``THESEUS_DISTRIBUTED=off`` turns the cluster detection off.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from theseus.errors import ConfigError

ENV_COORDINATOR = "THESEUS_COORDINATOR"
ENV_NUM_PROCESSES = "THESEUS_NUM_PROCESSES"
ENV_PROCESS_ID = "THESEUS_PROCESS_ID"
ENV_SWITCH = "THESEUS_DISTRIBUTED"


#: Variables one of the launchers jax detects sets (SLURM, Open MPI, Kubernetes, Cloud TPU).
LAUNCHER_VARIABLES = (
    "SLURM_JOB_ID",
    "OMPI_MCA_orte_hnp_uri",
    "KUBERNETES_SERVICE_HOST",
    "TPU_WORKER_HOSTNAMES",
    "TPU_PROCESS_ADDRESSES",
)


@dataclass(frozen=True)
class DistributedSetup:
    """How this process joined a multi-process run."""

    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    source: str  # "options", "environment" or the detected cluster's name


def _int_setting(value: Any, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None


def requested(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> DistributedSetup | None:
    """The explicit multi-process settings (options first, then environment), validated; None if none."""
    env = os.environ if environ is None else environ
    source = "options" if any(v is not None for v in (coordinator, num_processes, process_id)) else "environment"
    coordinator = coordinator or env.get(ENV_COORDINATOR) or None
    processes = (
        num_processes if num_processes is not None else _int_setting(env.get(ENV_NUM_PROCESSES), ENV_NUM_PROCESSES)
    )
    process = process_id if process_id is not None else _int_setting(env.get(ENV_PROCESS_ID), ENV_PROCESS_ID)
    given = {"--coordinator": coordinator, "--num-processes": processes, "--process-id": process}
    if all(v is None for v in given.values()):
        return None
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise ConfigError(
            f"a multi-process run needs --coordinator, --num-processes and --process-id (or {ENV_COORDINATOR}, "
            f"{ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}); missing {', '.join(missing)}"
        )
    assert coordinator is not None and processes is not None and process is not None
    if ":" not in coordinator:
        raise ConfigError(f"--coordinator must be host:port of process 0 (e.g. 10.0.0.1:1234), got {coordinator!r}")
    if processes < 1:
        raise ConfigError(f"--num-processes must be at least 1, got {processes}")
    if not 0 <= process < processes:
        raise ConfigError(f"--process-id must lie in [0, {processes}) for --num-processes {processes}, got {process}")
    return DistributedSetup(coordinator, processes, process, source)


def detected_cluster() -> str | None:
    """Name of a cluster launcher (as jax knows them) that started more than one process, else None.

    Only launchers whose own environment says so are considered (SLURM ``srun`` with several
    tasks, ``mpirun``, multi-host TPU, ...); a single-task allocation does not count.
    """
    if os.environ.get(ENV_SWITCH, "").lower() in ("0", "off", "false", "no"):
        return None
    if not any(name in os.environ for name in LAUNCHER_VARIABLES) and importlib.util.find_spec("libtpu") is None:
        return None  # no launcher around: a plain run, and no need to import jax to know it
    from jax._src import clusters

    for cluster in clusters.ClusterEnv._cluster_types:
        if getattr(cluster, "opt_in_only_method", False):
            continue
        try:
            with warnings.catch_warnings():  # e.g. "Kubernetes detected but the kubernetes package is missing"
                warnings.simplefilter("ignore")
                if cluster.is_env_present() and int(cluster.get_process_count()) > 1:
                    return str(getattr(cluster, "name", cluster.__name__))
        except Exception:  # an incomplete environment of that launcher: not a multi-process run
            continue
    return None


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise ConfigError(f"--coordinator must be host:port with a numeric port, got {address!r}") from None


def check_coordinator(setup: DistributedSetup, timeout: float) -> None:
    """Fail with one clear line where jax would abort the process: process 0's port is taken, or the
    coordinator cannot be reached by another process within ``timeout`` seconds."""
    assert setup.coordinator is not None
    host, port = _split_address(setup.coordinator)
    if setup.process_id == 0:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            try:
                probe.bind(("", port))
            except OSError as exc:
                raise ConfigError(
                    f"process 0 cannot serve the coordinator on port {port} ({exc.strerror}); "
                    "choose a free port in --coordinator"
                ) from None
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, max(timeout, 0.1))):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"process {setup.process_id} cannot reach the coordinator {setup.coordinator} after "
                    f"{timeout:g} s; start process 0 with the same --coordinator and check that the port is "
                    "open between the hosts"
                ) from None
            time.sleep(0.2)


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    timeout: float = 300.0,
) -> DistributedSetup | None:
    """Join the multi-process run described by the arguments, environment or cluster.

    Must run before anything uses a jax device. Returns None (and does nothing) for a
    single-process run or when ``jax.distributed`` is already initialised. Processes other
    than 0 wait up to ``timeout`` seconds for the coordinator.
    """
    setup = requested(coordinator, num_processes, process_id, environ=environ)
    if setup is None:
        cluster = detected_cluster()
        if cluster is None:
            return None
        setup = DistributedSetup(None, None, None, cluster)
    import jax

    if jax.distributed.is_initialized():
        return None
    if setup.coordinator is not None:
        check_coordinator(setup, timeout)
    env = os.environ if environ is None else environ
    if "JAX_CPU_COLLECTIVES_IMPLEMENTATION" not in env:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # cross-process collectives on CPU
    try:
        if setup.coordinator is None:
            jax.distributed.initialize(cluster_detection_method=setup.source)
        else:
            jax.distributed.initialize(
                setup.coordinator, setup.num_processes, setup.process_id, initialization_timeout=int(timeout)
            )
    except RuntimeError as exc:
        text = str(exc).strip().splitlines()
        raise ConfigError(
            f"cannot join the multi-process run ({setup.source}): {text[0] if text else type(exc).__name__}; "
            "check that process 0 runs and is reachable at the coordinator address, and that every process "
            "was given the same coordinator and process count"
        ) from exc
    return setup


def from_options(options: Mapping[str, Any] | None) -> DistributedSetup | None:
    """:func:`initialize` from the ``theseus run`` options (``coordinator``, ``num_processes``, ``process_id``)."""
    options = options or {}
    return initialize(options.get("coordinator"), options.get("num_processes"), options.get("process_id"))
