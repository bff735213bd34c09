"""Shared test helpers: running the CLI in subprocesses and building isolated venvs."""

from __future__ import annotations

import atexit
import compileall
import ctypes
import gc
import os
import resource
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import venv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from theseus.training.collector import OLDER_THRESHOLD, YOUNG_THRESHOLD

REPO = Path(__file__).resolve().parents[1]
#: A one-layer, 32-wide GPT reading 4 x 32 tokens per step: the smallest model the training tests run (no
#: plots: matplotlib's import is about half a CPU-second a process; tests of the plots turn them on).
TINY_GPT = [
    "architecture/n_layers=1",
    "architecture/n_embd=32",
    "architecture/n_heads=2",
    "architecture/block_size=32",
    "training/sequence_length=32",
    "training/batch_size=4",
    "training/plots=false",
]

# One persistent XLA compilation cache for the whole session, shared with every subprocess the
# tests start (clean_env keeps it): the trainer's own per-root cache would otherwise point into
# temporary roots that tests delete.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="theseus-test-xla-cache-"))
# Every program, however quickly it compiles (JAX's default keeps only those over a second): the suite's
# processes compile the same small programs again and again (tests/models and tests/generation: 4 % faster).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

#: XLA flags for this process and every subprocess the tests start: the suite is mostly compilation
#: of small programs. The backend (LLVM) optimisation level 0 compiles them about twice as fast (the
#: suite's CPU time fell by about 28 %), and XLA:CPU's loop emitters instead of its MLIR fusion
#: emitters about three times as fast again (a tiny GPT and Llama training step, both layouts: 16.5 s
#: -> 4.9 s of compile CPU, the same losses to the last bit). The programs are the same XLA programs;
#: their machine code may round differently in the last bit, so results are compared within one
#: setting, never against figures computed under another. ``xla_flags(production=True)`` restores
#: XLA's defaults for the tests that check a user's build (the SIGKILL resume test). One LLVM module per
#: program instead of XLA:CPU's split into parallel pieces: with every core already busy the split only
#: adds work (a tiny Llama's forward and backward: 0.30 -> 0.18 s of compile CPU, DeepSeek-V3's 0.56 -> 0.38 s).
#: The accelerator compiles (tests/plan) assemble their GPU kernels without ``ptxas``'s optimisations: the
#: plans (memory, FLOPs, collectives, custom calls) are the same to the byte, and ``ptxas`` (a third of a
#: case's CPU, one process per kernel) takes about a tenth less.
FAST_COMPILE = (
    "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
    " --xla_gpu_disable_gpuasm_optimizations=true"
)
# The flags from before the suite added its own, kept in the environment so that pytest-xdist workers
# (which inherit the controller's environment, FAST_COMPILE included) know them too.
os.environ.setdefault("TESTS_ORIGINAL_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
_INHERITED_XLA_FLAGS = os.environ["TESTS_ORIGINAL_XLA_FLAGS"]
if "xla_backend_optimization_level" not in _INHERITED_XLA_FLAGS:
    os.environ["XLA_FLAGS"] = f"{_INHERITED_XLA_FLAGS} {FAST_COMPILE}".strip()

#: prctl(2)'s PR_SET_THP_DISABLE: with 1, the process and every process it starts ignore MADV_HUGEPAGE.
PR_SET_THP_DISABLE = 41


def set_transparent_huge_pages(allowed: bool) -> None:
    """Let this process and the ones it starts use transparent huge pages, or keep them on 4 KiB pages."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, int(not allowed), 0, 0, 0)


def allow_transparent_huge_pages() -> None:
    """``preexec_fn`` of a subprocess that measures what huge pages change (the suite runs without)."""
    set_transparent_huge_pages(True)


# The suite's processes run on 4 KiB pages. `theseus run` asks glibc for transparent huge pages
# (theseus.base.host_memory), and a fresh huge page is zeroed whole when first touched, however little
# of it a short run uses: the kernel's zeroing took half the CPU cycles of docs/reinforcement-learning.md's
# arithmetic GRPO at its test step counts (perf), which runs in 17.8 s instead of 27.7 s on 4 KiB pages
# (system time 5 s instead of 22 s); a 3-step tiny GPT run spends 0.31 s instead of 0.60 s in the kernel.
# Values are the same either way.
set_transparent_huge_pages(False)

# Python's cyclic collector as a training run keeps it (theseus.training.collector): a test worker's heap
# grows to millions of objects (jax's caches, torch and transformers for the oracles), and at the default
# thresholds each full collection walks it all again. Rare collections take 5-9 % off the CPU time of
# tests/models and tests/generation in one process (two A/B pairs), at the same peak memory.
gc.set_threshold(YOUNG_THRESHOLD, OLDER_THRESHOLD, OLDER_THRESHOLD)

DISTRIBUTIONS = ["theseus-core", "theseus-models", "theseus-data", "theseus-plugins-example"]
#: The project's Python sources that the suite's processes import. pip compiles what it installs to
#: bytecode, but not an editable install's sources, and with ``PYTHONDONTWRITEBYTECODE`` set no process
#: writes it either: each of the suite's several hundred processes would compile what it imports again.
SOURCES = [REPO / d / "src" for d in DISTRIBUTIONS] + [REPO / "tests", REPO / "benchmarks"]


def pytest_configure(config: pytest.Config) -> None:
    """Once per run, before pytest-xdist starts its workers: the project's sources compiled to bytecode
    when Python does not write it on import (``PYTHONDONTWRITEBYTECODE``; reading it still works)."""
    if sys.dont_write_bytecode and not hasattr(config, "workerinput"):
        for folder in SOURCES:
            compileall.compile_dir(folder, quiet=1)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The end of a pytest process: its heap (a worker's: a million objects and more, jax's caches and the
    oracles) is left to the operating system instead of being walked again by full collections (pytest's
    last one, jax's exit hook's four and the interpreter's own): a process that ran tests/models' two
    largest files took 3.5 s from its last test to its exit, now 1.2 s. Later garbage is still collected;
    the persistent compilation cache is written as programs compile, not at exit."""
    gc.freeze()
    api = sys.modules.get("jax._src.api")
    if api is not None:
        atexit.unregister(api.clean_up)  # clears backends and caches, then collects four times


#: Where each pytest process appends the CPU time its test files took (``file seconds`` a line, the
#: process's own time and that of the subprocesses it waited for), when the variable is set: the suite's
#: cost by file, for keeping it inside its budget. Collection and start-up are not counted.
CPU_LOG = os.environ.get("THESEUS_TEST_CPU_LOG")
_cpu_by_file: dict[str, float] = {}


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    if not CPU_LOG:
        return (yield)
    began = _cpu_seconds()
    try:
        return (yield)
    finally:
        name = item.nodeid.split("::")[0]
        _cpu_by_file[name] = _cpu_by_file.get(name, 0.0) + _cpu_seconds() - began


def pytest_sessionfinish(session: pytest.Session) -> None:
    if CPU_LOG and _cpu_by_file:
        with open(CPU_LOG, "a", encoding="utf-8") as log:
            log.writelines(f"{name} {seconds:.1f}\n" for name, seconds in _cpu_by_file.items())


#: Seconds a simulated device's collective waits for the others before XLA ends the process.
COLLECTIVE_TIMEOUT = 600


def xla_flags(*, devices: int | None = None, production: bool = False) -> str:
    """``XLA_FLAGS`` for a test subprocess: the suite's flags (``FAST_COMPILE`` unless
    ``production``) plus ``devices`` simulated host devices."""
    flags = [_INHERITED_XLA_FLAGS if production else os.environ["XLA_FLAGS"]]
    if devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
        # simulated devices are threads sharing the host's cores: on a busy machine one can reach a
        # collective more than XLA's default 40 s after the others, which is not a hang
        flags.append(f"--xla_cpu_collective_call_terminate_timeout_seconds={COLLECTIVE_TIMEOUT}")
    return " ".join(flag for flag in flags if flag)


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without theseus plugin switches, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THESEUS_")}
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.update(extra)
    return env


def run_cli(
    args: list[str],
    *,
    python: str | Path = sys.executable,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run ``theseus ARGS`` with the given interpreter; returns the completed process."""
    return subprocess.run(
        [str(python), "-m", "theseus.cli.main", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        timeout=timeout,
    )


class Oracle:
    """A test-only reference library (torch, trl, ...) imported when a test first reads an attribute of
    it, so collecting the suite does not import it; a test reading it without it installed is skipped."""

    def __init__(self, module: str) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # what collection probes (``__test__``, fixture markers): not the library's
            raise AttributeError(name)
        return getattr(pytest.importorskip(self._module), name)


def free_port() -> int:
    """A TCP port nothing listens on now (for a coordinator on localhost)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_joined(
    args: Sequence[str],
    *,
    env: Callable[[int], dict[str, str]],
    count: int = 2,
    timeout: float = 300,
) -> list[subprocess.CompletedProcess[str]]:
    """``theseus ARGS`` as processes 0 .. ``count - 1`` of one run joined on localhost
    (``--coordinator``, ``--num-processes``, ``--process-id``), process ``i`` with ``env(i)``; each
    one's result. When one dies of a signal the others are killed, as ``srun --kill-on-bad-exit`` ends
    a job step; every process is killed when one outlives ``timeout``."""
    port = free_port()
    joined = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(count)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "theseus.cli.main", *args, *joined, "--process-id", str(index)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(index),
            cwd=REPO,
        )
        for index in range(count)
    ]
    outputs: dict[int, tuple[str, str]] = {}
    readers = [
        threading.Thread(target=lambda i=i, p=p: outputs.__setitem__(i, p.communicate()), daemon=True)
        for i, p in enumerate(processes)
    ]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    while any(reader.is_alive() for reader in readers):
        signalled = any(p.returncode is not None and p.returncode < 0 for p in processes)
        if signalled or time.monotonic() > deadline:
            for other in processes:
                if other.returncode is None:
                    other.kill()
            if not signalled:
                raise subprocess.TimeoutExpired(processes[0].args, timeout)
        time.sleep(0.05)
    return [subprocess.CompletedProcess(p.args, p.returncode, *outputs[i]) for i, p in enumerate(processes)]


def make_venv(path: Path, *, inherit: str) -> Path:
    """Create a venv without pip whose dependencies come from the running environment.

    ``inherit="site"`` processes the running environment's ``.pth`` files (so editable
    theseus installs are visible); ``inherit="packages"`` puts the running environment's
    packages on the path without any theseus distribution (their metadata, ``.pth`` files and
    source folders are left out), so theseus itself must come from wheels installed into the
    new venv and a distribution not installed there is really absent.
    """
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
    python = path / "bin" / "python"
    site_packages = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    parent = sysconfig.get_paths()["purelib"]
    if inherit == "site":
        lines = [f"import site; site.addsitedir({parent!r})"]
    else:
        lines = [str(p) for p in _without_theseus(_site_dirs(Path(parent)), path / "inherited")]
    (site_packages / "_theseus_test_inherit.pth").write_text("\n".join(lines) + "\n")
    return python


def _is_theseus(name: str) -> bool:
    return "theseus" in name.lower()


def _site_dirs(first: Path) -> list[Path]:
    """``first`` and the folders its ``.pth`` files add (recursively), theseus source folders left out."""
    sources = {(REPO / d / "src").resolve() for d in DISTRIBUTIONS}
    found: list[Path] = []
    queue = [first]
    while queue:
        folder = queue.pop(0)
        if folder in found or not folder.is_dir():
            continue
        found.append(folder)
        for pth in sorted(folder.glob("*.pth")):
            if _is_theseus(pth.name):
                continue
            for line in pth.read_text().splitlines():
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                target = (folder / line).resolve()
                if target not in sources and not _is_theseus(target.name):
                    queue.append(target)
    return found


def _without_theseus(folders: list[Path], farm: Path) -> list[Path]:
    """The folders, each holding a theseus entry replaced by a folder of links to its other entries."""
    out: list[Path] = []
    for index, folder in enumerate(folders):
        entries = list(folder.iterdir())
        if not any(_is_theseus(e.name) for e in entries):
            out.append(folder)
            continue
        view = farm / str(index)
        view.mkdir(parents=True)
        for entry in entries:
            if not _is_theseus(entry.name) and entry.suffix != ".pth":
                (view / entry.name).symlink_to(entry)
        out.append(view)
    return out


def pip_install(python: Path, *targets: str | Path) -> None:
    """Install local projects or wheels into ``python``'s venv, offline and without deps."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            *map(str, targets),
        ],
        check=True,
        capture_output=True,
        text=True,
    )


def build_wheels(out: Path, projects: list[Path]) -> list[Path]:
    """Build wheels of ``projects`` into ``out`` (offline, no build isolation)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            *map(str, projects),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return sorted(out.glob("*.whl"))


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Wheels of the four distributions, built once per test session: distribution name -> wheel."""
    built = build_wheels(tmp_path_factory.mktemp("wheelhouse"), [REPO / d for d in DISTRIBUTIONS])
    by_name = {wheel.name.split("-")[0].replace("_", "-"): wheel for wheel in built}
    assert sorted(by_name) == sorted(DISTRIBUTIONS), built
    return by_name
