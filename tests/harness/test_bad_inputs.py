"""Mistakes are one ``error:`` line through the installed ``theseus`` command, never a traceback.

The commands of ``CASES`` run as concurrent subprocesses of the installed command, started once for
the module (the unknown name indexes lm-eval's built-in tasks, about 15 seconds; the others take a
few seconds each); those of ``IN_PROCESS`` run the same command line in this process.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import clean_env
from tests.harness.conftest import Imported, dataset, theseus_main

THESEUS = shutil.which("theseus", path=str(Path(sys.executable).parent)) or shutil.which("theseus")

#: Each case: its arguments after ``theseus run eval/harness`` and the error line it must print
#: (``{root}`` and ``{tasks}`` are filled in; ``...`` stands for any text: the other close names depend on
#: lm-eval's own tasks). ``no-lm-eval`` runs with lm-eval hidden.
CASES: dict[str, tuple[list[str], str]] = {
    "no-lm-eval": (
        ["eval/tasks=tiny_choice"],
        "error: eval/harness needs lm-evaluation-harness; pip install 'theseus-models[eval]'",
    ),
    "unknown-task": (
        ["eval/tasks=tiny_choise", "eval/include_path={tasks}"],
        "error: unknown lm-eval task 'tiny_choise' (eval/tasks); did you mean 'tiny_choice'...? searched the "
        "tasks of {tasks} and lm-eval's own; list them with 'lm-eval ls tasks'",
    ),
    "sampling-setting": (
        ["eval/tasks=tiny_sampled", "eval/include_path={tasks}"],
        "error: lm-eval task 'tiny_sampled' asks for generation_kwargs.repetition_penalty=1.3, which theseus cannot "
        "honour (it decodes greedily, or samples with temperature, top_k and top_p)",
    ),
    "missing-run": (
        ["eval/run=nope", "eval/tasks=tiny_choice"],
        "error: no run 'nope' under {root}/runs (available: tiny)",
    ),
}

#: Cases run in this process (through the same command line).
IN_PROCESS: dict[str, tuple[list[str], str]] = {
    "output-type": (
        ["eval/tasks=tiny_ranking", "eval/include_path={tasks}"],
        "error: lm-eval task 'tiny_ranking' ({tasks}/tiny_ranking.yaml) has output_type 'ranking', which theseus "
        "cannot run; it runs loglikelihood, loglikelihood_rolling, generate_until, multiple_choice tasks",
    ),
    "missing-step": (
        ["eval/run=tiny@7", "eval/tasks=tiny_choice"],
        "error: run 'tiny' has no checkpoint at step 7; available steps: 0",
    ),
}


def write_unsupported(folder: Path) -> Path:
    """The local tasks of ``CASES`` beside copies of the working ones: one sampling with a setting
    theseus lacks, one of an output type it cannot run."""
    (folder / "tiny_sampled.yaml").write_text(
        "task: tiny_sampled\n" + dataset(folder, "sampled", [{"prompt": "a", "target": "b"}]) + "output_type: "
        'generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{target}}"\n'
        "generation_kwargs:\n  do_sample: true\n  temperature: 0.7\n  repetition_penalty: 1.3\n"
    )
    (folder / "tiny_ranking.yaml").write_text(
        "task: tiny_ranking\n" + dataset(folder, "ranking", [{"prompt": "a", "target": "b"}]) + "output_type: "
        'ranking\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{target}}"\n'
    )
    return folder


@pytest.fixture(scope="module")
def finished(imported: Imported, offline: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case's completed process (they run at the same time)."""
    assert THESEUS, "the theseus console script is not installed beside this interpreter"
    folder = tmp_path_factory.mktemp("bad-inputs")
    tasks = folder / "tasks"
    shutil.copytree(imported.tasks, tasks)
    write_unsupported(tasks)
    hidden = folder / "hidden"
    (hidden / "lm_eval").mkdir(parents=True)
    (hidden / "lm_eval" / "__init__.py").write_text("raise ImportError('lm_eval is hidden from this process')\n")
    started = {}
    for name, (args, _) in CASES.items():
        env = clean_env(**offline, **({"PYTHONPATH": str(hidden)} if name == "no-lm-eval" else {}))
        argv = [THESEUS, "run", "eval/harness", *(a.format(tasks=tasks) for a in args), "--root", str(imported.root)]
        started[name] = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=300)
        done[name] = (process.returncode, out, err)
    return {"done": done, "tasks": tasks, "root": imported.root}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_error_line(finished: dict[str, Any], case: str) -> None:
    code, out, err = finished["done"][case]
    expected = CASES[case][1].format(tasks=finished["tasks"], root=finished["root"])
    assert code != 0, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    line = err.strip().splitlines()[-1]
    head, dots, tail = expected.partition("...")
    assert line.startswith(head) and line.endswith(tail) if dots else line == expected, err[-2000:]
    assert sum(line.startswith("error:") for line in err.splitlines()) == 1


@pytest.mark.parametrize("case", list(IN_PROCESS))
def test_bad_input_in_process_is_one_error_line(
    finished: dict[str, Any], case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args, expected = IN_PROCESS[case]
    tasks, root = finished["tasks"], finished["root"]
    capsys.readouterr()
    code = theseus_main("run", "eval/harness", *(a.format(tasks=tasks) for a in args), "--root", str(root))
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == expected.format(tasks=tasks, root=root)
