"""Every command under the same failure rules as ``theseus run``: a full disk, a read-only or forbidden
path and running out of memory end as one ``error:`` line with exit code 2, never a traceback.

Each command runs in this process with the failure raised where the command really meets it (listing the
runs, reading a run's metrics, reading the checkpoint to import, checking the export folder, writing the
prepared data, loading the run to sample from or to evaluate, compiling a plan).
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.conftest import call_cli, error_line

#: Out of memory as XLA reports it.
XLA_OOM = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4.00G"


def xla_out_of_memory() -> Exception:
    import jax

    return jax.errors.JaxRuntimeError(XLA_OOM)


def raising(make: Callable[[], BaseException]) -> Callable[..., Any]:
    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise make()

    return fail


def a_run(root: Path) -> None:
    """A finished run's records (``runs show`` reads them)."""
    run = root / "runs" / "r"
    run.mkdir(parents=True)
    (run / "status.json").write_text(json.dumps({"state": "completed", "step": 2, "total_steps": 2}))
    (run / "metrics.jsonl").write_text('{"step": 2, "split": "train", "loss": 1.0}\n')


#: command -> (arguments after ``--root ROOT``, where it fails: module, attribute, the error; the line)
COMMANDS: dict[str, tuple[list[str], str, str, Callable[[Path], BaseException], str]] = {
    "runs": (
        ["runs"],
        "theseus.tracking.runs",
        "list_runs",
        lambda root: PermissionError(errno.EACCES, "Permission denied", str(root / "runs")),
        "error: permission denied for '{root}/runs'; give this user access to '{root}/runs' or choose another --root",
    ),
    "runs show": (
        ["runs", "show", "r"],
        "theseus.runs.records",
        "read_metrics",
        lambda root: PermissionError(errno.EACCES, "Permission denied", str(root / "runs" / "r" / "metrics.jsonl")),
        "error: permission denied for '{root}/runs/r/metrics.jsonl'; give this user access to "
        "'{root}/runs/r/metrics.jsonl' or choose another --root",
    ),
    "plan": (
        ["plan", "train/pretrain", "--target", "v5e:1"],
        "theseus.plan.report",
        "make_plan",
        lambda _root: xla_out_of_memory(),
        f"error: out of memory running theseus plan (JaxRuntimeError: {XLA_OOM}); use a smaller configuration",
    ),
    "hf/import": (
        ["run", "hf/import", "run/name=imported", "hf/source={root}"],
        "theseus.model.huggingface.importer",
        "prepare",
        lambda _root: MemoryError(),
        "error: out of memory running hf/import (MemoryError: MemoryError); use a smaller configuration",
    ),
    "hf/export": (
        ["run", "hf/export", "hf/run=r", "hf/out={root}/export"],
        "theseus.model.huggingface.exporter",
        "output_folder",
        lambda root: OSError(errno.EROFS, "Read-only file system", str(root / "export")),
        "error: '{root}/export' is on a read-only file system; make '{root}' writable or choose another --root",
    ),
    "data/tokenize": (
        ["run", "data/tokenize", "data/dataset=local", "data/local/path={root}/docs.jsonl", "data/name=corpus"],
        "theseus.data.jobs",
        "prepare",
        lambda _root: OSError(errno.ENOSPC, "No space left on device"),
        "error: no space left on the device while writing under --root '{root}' or data/local/path "
        "'{root}/docs.jsonl'; free disk space on the device holding '{root}' or choose another --root, then run "
        "the same command again",
    ),
    "generate": (
        ["run", "generate", "generate/prompt=hi", "generate/samples=4"],
        "theseus.model.loading.run",
        "load_run",
        lambda _root: xla_out_of_memory(),
        f"error: out of memory running generate (JaxRuntimeError: {XLA_OOM}); use less memory per step with "
        "generate/samples=2",
    ),
    "eval/harness": (
        ["run", "eval/harness", "eval/run=r", "eval/tasks=arc_easy"],
        "theseus.model.harness.jobs",
        "parse_run",
        lambda root: PermissionError(errno.EACCES, "Permission denied", str(root / "runs")),
        "error: permission denied for '{root}/runs'; give this user access to '{root}/runs' or choose another --root",
    ),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_machine_failure_is_one_line_for_every_command(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    args, module, attribute, error, expected = COMMANDS[command]
    root = tmp_path / "root"
    root.mkdir()
    a_run(root)
    (root / "docs.jsonl").write_text('{"text": "a document"}\n')
    monkeypatch.setattr(importlib.import_module(module), attribute, raising(lambda: error(root)))
    if command == "plan":  # no accelerator compiler is needed to reach the plan, nor jax restarted on the CPU
        monkeypatch.setattr("theseus.plan.devices.require_compiler", lambda _platform: None)
        monkeypatch.setattr("theseus.plan.devices.start_cpu_backend", lambda: None)
    filled = [arg.replace("{root}", str(root)) for arg in args]
    capsys.readouterr()
    code = call_cli([*filled[:1], *filled[1:], "--root", str(root)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert error_line(err) == expected.format(root=root)
