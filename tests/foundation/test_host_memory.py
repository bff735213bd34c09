"""Huge pages for XLA's host buffers: ``theseus run`` restarts itself once with glibc's tunable set,
and the tunable removes the page faults of the buffers XLA allocates on every call."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import allow_transparent_huge_pages, clean_env
from theseus.base import host_memory
from theseus.base.host_memory import HUGE_PAGES, TUNABLES, huge_page_environment
from theseus.cli.entry import subcommand


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "train/pretrain", "training/steps=3"], "run"),
        (["-v", "run", "demo/gpt"], "run"),
        (["--load", "run", "jobs"], "jobs"),  # a --load value named "run" is not the subcommand
        (["--load", "my_jobs.py", "run", "user/count"], "run"),
        (["--verbose"], None),
        ([], None),
    ],
)
def test_subcommand_skips_group_options(args: list[str], expected: str | None) -> None:
    assert subcommand(args) == expected


@pytest.fixture
def huge_pages_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_memory, "glibc_version", lambda: (2, 36))
    monkeypatch.setattr(host_memory, "transparent_huge_pages", lambda: True)


@pytest.mark.usefixtures("huge_pages_available")
def test_tunable_is_added_once_and_respects_the_user() -> None:
    assert huge_page_environment({"PATH": "/bin"}) == {"PATH": "/bin", TUNABLES: HUGE_PAGES}
    other = "glibc.malloc.arena_max=2"
    assert huge_page_environment({TUNABLES: other})[TUNABLES] == f"{other}:{HUGE_PAGES}"  # type: ignore[index]
    assert huge_page_environment({TUNABLES: "glibc.malloc.hugetlb=0"}) is None  # the user's own choice
    assert huge_page_environment({TUNABLES: HUGE_PAGES}) is None  # already restarted
    assert huge_page_environment({"THESEUS_HOST_ALLOCATOR": "system"}) is None


def test_nothing_changes_without_glibc_or_huge_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_memory, "transparent_huge_pages", lambda: True)
    monkeypatch.setattr(host_memory, "glibc_version", lambda: None)  # musl, macOS
    assert huge_page_environment({}) is None
    monkeypatch.setattr(host_memory, "glibc_version", lambda: (2, 31))  # before the tunable existed
    assert huge_page_environment({}) is None
    monkeypatch.setattr(host_memory, "glibc_version", lambda: (2, 36))
    monkeypatch.setattr(host_memory, "transparent_huge_pages", lambda: False)
    assert huge_page_environment({}) is None


def _plain_env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in clean_env(**extra).items() if k != TUNABLES}


# The console command, driven as its script does; prints the tunables each time it starts.
CONSOLE = textwrap.dedent(
    """
    import os, sys
    print("start", os.environ.get("GLIBC_TUNABLES"), flush=True)
    sys.argv = ["theseus", *sys.argv[1:]]
    from theseus.cli.entry import main
    main()
    """
)


def _console(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CONSOLE, *args], capture_output=True, text=True, env=_plain_env(**env), timeout=120
    )


@pytest.mark.skipif(huge_page_environment(_plain_env()) is None, reason="needs glibc >= 2.35 and huge pages")
def test_theseus_run_restarts_once_with_huge_pages() -> None:
    done = _console("run", "no/such-job")
    assert done.stdout.splitlines() == ["start None", f"start {HUGE_PAGES}"]
    assert done.returncode == 2
    assert done.stderr.count("error:") == 1 and "no/such-job" in done.stderr

    listing = _console("jobs")  # only `run` restarts: listings stay one interpreter start
    assert listing.returncode == 0
    assert listing.stdout.splitlines()[0] == "start None"
    assert f"start {HUGE_PAGES}" not in listing.stdout

    opted_out = _console("run", "no/such-job", THESEUS_HOST_ALLOCATOR="system")
    assert opted_out.stdout.splitlines() == ["start None"] and opted_out.returncode == 2


# XLA allocates each call's 64 MiB result afresh; counts the page faults of each of 6 calls.
FAULTS = textwrap.dedent(
    """
    import json, resource
    import jax, jax.numpy as jnp
    add = jax.jit(lambda x: x + 1.0)
    x = jnp.ones(16 * 2**20, jnp.float32)
    add(x).block_until_ready()
    faults = []
    for _ in range(6):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        add(x).block_until_ready()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"faults": faults, "pages": x.nbytes // resource.getpagesize()}))
    """
)


def _faults(env: dict[str, str]) -> tuple[list[int], int]:
    done = subprocess.run(
        [sys.executable, "-c", FAULTS],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        preexec_fn=allow_transparent_huge_pages,  # the suite's processes keep 4 KiB pages
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    return report["faults"], report["pages"]


@pytest.mark.skipif(huge_page_environment(_plain_env()) is None, reason="needs glibc >= 2.35 and huge pages")
def test_huge_pages_remove_the_page_faults_of_each_call() -> None:
    system, pages = _faults(_plain_env())
    huge, _ = _faults(huge_page_environment(_plain_env()))  # type: ignore[arg-type]
    assert min(system) >= pages // 2  # glibc's default: the whole buffer is faulted in on every call
    # 2 MiB pages fault 512 times less often where the kernel has free huge pages; on a busy machine some
    # 2 MiB regions fall back to 4 KiB pages, so the claim is on the six calls together, with that margin.
    assert min(huge) <= pages // 16, huge
    assert 3 * sum(huge) <= sum(system), (huge, system)
