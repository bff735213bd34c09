"""The command flows of the docs pages: extracted from the pages and run through the installed ``theseus``.

A *flow* is a sequence of shell blocks a reader is meant to run in order. A block is part of flow
``NAME`` when the line just above its opening fence is the HTML comment ``<!-- doc-flow: NAME -->``
(invisible on the rendered page); the blocks of one name run in page order. Every other block
(placeholders such as ``JOB`` or ``...``, hub downloads, sample output) is only text. Options after
the name change what the block is:

- ``<!-- doc-flow: NAME script -->``: the block runs as one ``bash -e`` script (loops, ``&``,
  ``wait``, ``export``), not line by line;
- ``<!-- doc-flow: NAME file=PATH -->``: the block's text is written to ``PATH`` in the flow's
  working directory before the flow's commands run (the ``my_jobs.py`` a command loads).

Commands are the lines of a block: in ``text`` blocks the lines that start with a ``$ `` prompt
(the other lines are sample output), in ``bash``/``sh`` blocks every line that is not a comment.
A line ending in ``\\`` continues on the next one, and a trailing ``# comment`` (outside quotes) is
not part of the command.

:class:`Shell` runs the commands in a temporary working directory with ``THESEUS_ROOT`` pointing
into it and the network switched off. A command whose first word is ``theseus`` runs as a
subprocess of the installed entry point (``shutil.which("theseus")``) with the page's arguments
split like a shell splits them; any other command (``pip install ...``, ``cd DIR && pytest``) and
every script runs under ``bash`` with that entry point's folder first on ``PATH``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO, clean_env

DOCS = REPO / "docs"

#: The ``theseus`` every flow runs: the console script installed beside this interpreter.
THESEUS = shutil.which("theseus", path=str(Path(sys.executable).parent)) or shutil.which("theseus")

#: Settings every flow runs under: nothing is fetched from the network (the Hugging Face hub,
#: package indexes, Weights & Biases), and jax stays on the CPU.
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "PIP_NO_INDEX": "1",
    "JAX_PLATFORMS": "cpu",
}

_FENCE = re.compile(
    r"^<!--\s*doc-flow:\s*(?P<name>[\w.-]+)(?P<options>[^>]*?)\s*-->[ \t]*\n"
    r"(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^(?P=indent)```",
    re.DOTALL | re.MULTILINE,
)
_ANY_MARKER = re.compile(r"<!--\s*doc-flow\b")
SHELL_LANGUAGES = {"bash", "sh", "shell", "console", "text"}


@dataclass(frozen=True)
class Step:
    """One thing a flow does: a ``command`` line, a ``script`` block, or a ``file`` it writes."""

    kind: str
    text: str
    line: int
    path: str = ""

    def __str__(self) -> str:
        return self.text if self.kind != "file" else f"(write {self.path})"


@dataclass(frozen=True)
class Flow:
    page: Path
    name: str
    steps: tuple[Step, ...]

    @property
    def commands(self) -> list[str]:
        return [s.text for s in self.steps if s.kind == "command"]

    @property
    def files(self) -> dict[str, str]:
        return {s.path: s.text for s in self.steps if s.kind == "file"}


def strip_comment(line: str) -> str:
    """``line`` without a trailing shell comment: a ``#`` at the start or after a blank, outside quotes."""
    quote = ""
    escaped = False
    for index, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1] in " \t"):
            return line[:index].rstrip()
    return line.rstrip()


def commands(body: str, lang: str) -> list[tuple[int, str]]:
    """The commands of a shell block as (line offset in the block, command); see the module docstring."""
    prompted = lang in {"text", "console"}
    found: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for offset, raw in enumerate(body.splitlines()):
        if pending:
            line = strip_comment(raw).strip()
        else:
            stripped = raw.strip()
            if prompted:
                if not stripped.startswith("$ "):
                    continue  # sample output
                stripped = stripped[2:]
            line = strip_comment(stripped).strip()
            if not line:
                continue
            start = offset
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        found.append((start, " ".join(part for part in pending if part)))
        pending = []
    if pending:
        raise ValueError(f"the block ends inside a continued command: {' '.join(pending)!r}")
    return found


def _options(text: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for word in text.split():
        key, _, value = word.partition("=")
        if key not in {"script", "file"} or (key == "file") != bool(value):
            raise ValueError(f"unknown doc-flow option {word!r} (options: script, file=PATH)")
        options[key] = value
    return options


def page_flows(page: Path) -> dict[str, Flow]:
    """The flows marked on ``page``, by name, each with its steps in page order."""
    text = page.read_text()
    steps: dict[str, list[Step]] = {}
    matched = 0
    for match in _FENCE.finditer(text):
        matched += 1
        name, lang, body = match["name"], match["lang"], match["body"]
        indent = match["indent"]
        body = "".join(line.removeprefix(indent) for line in body.splitlines(keepends=True))
        options = _options(match["options"])
        first = text.count("\n", 0, match.start("body")) + 1
        where = f"{page.name}:{first - 1}"
        if "file" in options:
            step = [Step("file", body, first, options["file"])]
        elif lang not in SHELL_LANGUAGES:
            raise ValueError(f"{where}: doc-flow {name!r} marks a {lang or 'plain'} block; mark shell blocks only")
        elif "script" in options:
            step = [Step("script", body, first)]
        else:
            found = commands(body, lang)
            if not found:
                raise ValueError(f"{where}: doc-flow {name!r} marks a block without commands")
            step = [Step("command", command, first + offset) for offset, command in found]
        steps.setdefault(name, []).extend(step)
    if matched != len(_ANY_MARKER.findall(text)):
        raise ValueError(f"{page.name}: a doc-flow marker is not on the line just above a code block")
    return {name: Flow(page, name, tuple(found)) for name, found in steps.items()}


def shell_pages() -> list[Path]:
    """The docs pages and READMEs holding shell code blocks."""
    pages = [*sorted(DOCS.rglob("*.md")), *sorted(REPO.glob("*.md")), *sorted(REPO.glob("theseus-*/README.md"))]
    fence = re.compile(r"^[ \t]*```(bash|sh|shell|console)\b|^[ \t]*```text\n[ \t]*\$ ", re.MULTILINE)
    return [p for p in pages if fence.search(p.read_text())]


@dataclass
class Result:
    step: Step
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def lines(self) -> list[list[str]]:
        """stdout as lists of words, one per line."""
        return [line.split() for line in self.stdout.splitlines()]


@dataclass
class Shell:
    """A working directory, a root and an environment in which a flow's steps run one after another."""

    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)
    timeout: float = 300

    @classmethod
    def create(cls, cwd: Path, **extra: str) -> Shell:
        """A shell in ``cwd`` with ``THESEUS_ROOT=cwd/root``, offline, plus ``extra`` settings."""
        assert THESEUS, "the theseus console script is not installed beside this interpreter"
        cwd.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join([str(Path(THESEUS).parent), os.environ.get("PATH", "")])
        env = clean_env(**{**OFFLINE, "THESEUS_ROOT": str(cwd / "root"), "PATH": path, **extra})
        return cls(cwd, env)

    @property
    def root(self) -> Path:
        return Path(self.env["THESEUS_ROOT"])

    def run(self, flow: Flow) -> list[Result]:
        """Write the flow's files, then run its commands and scripts in order; each must exit 0."""
        for path, text in flow.files.items():
            (self.cwd / path).parent.mkdir(parents=True, exist_ok=True)
            (self.cwd / path).write_text(text)
        done = []
        for step in flow.steps:
            if step.kind == "file":
                continue
            result = self.step(step)
            done.append(result)
            if result.returncode != 0:
                raise AssertionError(
                    f"{flow.page.name}:{step.line} (flow {flow.name!r}) exited with {result.returncode}:\n"
                    f"$ {step}\n--- stdout (end) ---\n{result.stdout[-3000:]}\n--- stderr (end) ---\n"
                    f"{result.stderr[-3000:]}"
                )
        return done

    def step(self, step: Step) -> Result:
        if step.kind == "script":
            argv = ["bash", "-e", "-c", step.text]
        else:
            words = shlex.split(step.text)
            argv = [str(THESEUS), *words[1:]] if words[0] == "theseus" else ["bash", "-c", step.text]
        began = time.perf_counter()
        # A session of its own: a command that outlives the timeout is ended with everything it started
        # (the background processes of a script hold its output pipes open).
        process = subprocess.Popen(
            argv,
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            stderr += f"\n(killed after {self.timeout:.0f} s, with every process it started)"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # nothing a step started outlives it
        result = Result(step, process.returncode, stdout, stderr, time.perf_counter() - began)
        self.results.append(result)
        return result

    def result(self, prefix: str) -> Result:
        """The result of the command ``prefix``, else of the one command starting with ``prefix`` (the
        latest result when that command ran more than once)."""
        found = [r for r in self.results if r.step.text == prefix]
        if not found:
            found = [r for r in self.results if r.step.text.startswith(prefix)]
            assert len({r.step.text for r in found}) <= 1, f"several commands start with {prefix!r}"
        assert found, f"no command starting with {prefix!r} ran; ran: {[str(r.step) for r in self.results]}"
        return found[-1]
