"""Inputs that once made a command run forever: a YAML file of nested aliases (a "billion laughs"), a chat
template of nested loops, a checkpoint write that fails and leaves orbax's threads waiting. Each now ends
within seconds, in one line naming the file (YAML, template) or the failed write. The tests run under
timeouts, so a hang fails them instead of stopping the suite.
"""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_cli
from tests.reliability.conftest import HERE, error_line, train_args
from theseus.config import read_yaml, yaml_limits
from theseus.data import bounded_jinja
from theseus.data.chat import ChatTemplate
from theseus.errors import ConfigError, DataError
from theseus.runs import records

Cli = Callable[[list[str]], tuple[int, str]]
#: The module (``theseus.config.configuration`` is also the name of a function the package exports).
CONFIGURATION = importlib.import_module("theseus.config.configuration")

#: Nine anchors, each a list of nine of the one before: 9**9 (387 million) values in ten short lines.
LAUGHS = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{name}: &{name} [{', '.join(f'*{before}' for _ in range(9))}]\n"
    for before, name in zip("abcdefgh", "bcdefghi", strict=True)
)
BOUND = (
    "stands for more than 100,000 values once its aliases are expanded (nested anchors and aliases); "
    "write the values out without anchors and aliases"
)


# -- YAML ------------------------------------------------------------------------------------------


def test_expanded_values_are_counted_once_per_node() -> None:
    assert yaml_limits.expanded_values("a: 1\nb: [1, 2]") == 7  # the mapping, two keys, 1, the list and its two
    assert yaml_limits.expanded_values("x: &x [1, 2]\ny: [*x, *x]") == 13  # an alias counts what it stands for
    assert yaml_limits.expanded_values(LAUGHS) == yaml_limits.MAX_VALUES + 1  # counted up to just past the bound
    assert yaml_limits.expanded_values("a: &a [1, *a]") is None  # a value that contains itself
    assert yaml_limits.expanded_values("a: [unclosed") == 0  # left to the loader to report


@pytest.mark.timeout(30)
def test_a_billion_laughs_config_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS + "a: 1\n")  # a key given twice: the message once walked every alias
    with pytest.raises(ConfigError) as refused:
        read_yaml(path)
    assert str(refused.value) == f"config file {str(path)!r} {BOUND}"
    assert records.read_yaml(path) == {}  # listings read it as unreadable and go on
    assert CONFIGURATION._duplicate_key(LAUGHS + "a: 1\n") == "key 'a' given twice, at lines 1 and 10"


def test_a_value_that_contains_itself_and_an_oversized_file_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "self.yaml"
    path.write_text("training: &t\n  steps: *t\n")
    with pytest.raises(ConfigError, match="has an alias inside the anchor it names"):
        read_yaml(path)
    monkeypatch.setattr(yaml_limits, "MAX_BYTES", 16)
    path.write_text("training:\n  steps: 3\n")  # 23 bytes
    with pytest.raises(ConfigError, match="is larger than 0 MiB"):
        read_yaml(path)


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("compilation_cache")
def test_a_billion_laughs_in_config_or_in_a_run_folder_stops_run_resume_and_runs_show(
    cli: Cli, root: Path, tmp_path: Path
) -> None:
    config = tmp_path / "laughs.yaml"
    config.write_text(LAUGHS)
    code, err = cli(train_args(root, "--config", str(config)))
    assert code == 2 and error_line(err) == f"error: config file {str(config)!r} {BOUND}"
    run = root / "runs" / "laughs"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(LAUGHS)
    code, err = cli(train_args(root, "run/name=laughs"))  # resuming reads the run's config.yaml
    assert code == 2 and error_line(err) == f"error: config file {str(run / 'config.yaml')!r} {BOUND}"
    code, _ = cli(["runs", "show", "laughs", "--root", str(root)])
    assert code == 0


# -- chat templates -----------------------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.mark.timeout(30)
def test_a_template_of_nested_loops_is_stopped_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded_jinja, "RENDER_SECONDS", 0.3)
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(DataError) as stopped:
        ChatTemplate(loops, name="loops.jinja").render(MESSAGES)
    assert time.monotonic() - started < 15  # the deadline, not the loops' hours
    assert str(stopped.value) == (
        "chat template loops.jinja was stopped while rendering a conversation: it ran for more than 0.3 s; "
        "choose another template with data/chat/template"
    )
    macro = "{% macro f() %}{% for m in messages %}{{ f() }}{% endfor %}{% endmacro %}{{ f() }}"
    with pytest.raises(DataError, match=r"failed to render|was stopped"):  # recursion: Python's limit or the time
        ChatTemplate(macro, name="macro.jinja").render(MESSAGES)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("{{ '%*s' % (10**9, 'x') }}", "it asked for a field wider than 16,777,216 characters"),
        ("{{ '{:>1000000000}'.format('x') }}", "it asked for a field wider than 16,777,216 characters"),
        ("{{ '%1000000000s'|format('x') }}", "it asked for a field wider than 16,777,216 characters"),
        ("{{ 'x'.ljust(10**9) }}", "it gave ljust a number larger than 16,777,216"),
        ("{{ 'x'|center(10**9) }}", "it gave center a number larger than 16,777,216"),
        ("{{ ('x' * 10**6)|replace('x', 'x' * 100) }}", "it built a value of more than 16,777,216 characters or items"),
        ("{{ ('x' * 10**6).replace('x', 'x' * 100) }}", "it built a value of more than 16,777,216 characters or items"),
        ("{{ 'x' * 10**10 }}", "it built a value of more than 16,777,216 characters or items"),
        ("{{ 7 ** 100000000 }}", "it built an integer of more than 65536 bits"),
        ("{{ '%1000000000s' % 'x' }}", "it asked for a field wider than 16,777,216 characters"),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "it built a value of more than 16,777,216 characters or items",
        ),
        (
            "{% for i in range(100000) %}{% for j in range(1000) %}{{ 'abcdefgh' }}{% endfor %}{% endfor %}",
            "it wrote more than 16,777,216 characters",
        ),
    ],
)
def test_a_template_that_builds_too_much_is_stopped(source: str, reason: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded_jinja, "RENDER_SECONDS", 240.0)  # a slow machine meets the size bound first too
    with pytest.raises(DataError) as stopped:
        ChatTemplate(source, name="big.jinja").render(MESSAGES)
    assert f"was stopped while rendering a conversation: {reason};" in str(stopped.value)


def test_built_in_templates_render_as_before() -> None:
    text = ChatTemplate.load("chatml").render(MESSAGES, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>assistant\n"


# -- ending the process ----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_failed_checkpoint_write_ends_the_process(root: Path, tmp_path: Path) -> None:
    """A link where orbax makes its temporary folder fails the save; orbax's other threads of that save then
    wait for a signal that never comes, and the command, its error line printed, never exited."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept").write_text("kept")
    checkpoints = root / "runs" / "v" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "2.orbax-checkpoint-tmp").symlink_to(elsewhere)
    done = run_cli(train_args(root, "run/name=v"), timeout=100)
    assert done.returncode == 2
    assert error_line(done.stderr).startswith(
        f"error: writing checkpoint {str(checkpoints / '2')!r} failed (OSError: Cannot call rmtree on a symbolic link)"
    )
    assert (elsewhere / "kept").read_text() == "kept" and sorted(p.name for p in elsewhere.iterdir()) == ["kept"]


#: Starts the rest of the command line as a fresh Python whose SIGINT is at its default but blocked, as a
#: launcher (or a test runner's process, whose signal mask a child inherits) may leave it.
SIGINT_BLOCKED = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@pytest.mark.timeout(60)
def test_ctrl_c_ends_the_command_although_a_thread_waits_forever(tmp_path: Path) -> None:
    """Also when SIGINT reaches the command blocked: it unblocks it (it once waited forever for a Ctrl-C the
    test runner's worker process had blocked)."""
    command = [sys.executable, "-c", SIGINT_BLOCKED, "-m", "theseus.cli.main", "--load", str(HERE / "stuck_job.py")]
    command += ["run", "test/stuck"]
    process = subprocess.Popen(
        [*command, "--root", str(tmp_path)], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130
    assert err.strip().splitlines()[-1] == "aborted"


@pytest.mark.timeout(60)
def test_a_defect_ends_the_command_with_its_traceback_although_a_thread_waits_forever(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "theseus.cli.main", "--load", str(HERE / "stuck_job.py"), "run", "test/broken"]
    done = subprocess.run(
        [*command, "--root", str(tmp_path)], env=clean_env(), capture_output=True, text=True, timeout=45
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == "RuntimeError: a defect in a job"
