"""Generated malformed ``--config`` files: the configurations ``theseus configure`` writes, cut, spliced,
re-indented, with lines doubled, values replaced by hostile text and bytes that are not UTF-8. Reading
one as ``theseus run --config`` does (then selecting, resolving and building the job) either works or
stops with one line.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.reliability.fuzzing import ACCEPTED, HOSTILE_TEXT, ONE_LINE, attempt, fuzz_settings, hostile_text, validate

#: Jobs whose written configurations are mutated: a trainer, a data job, an import and generation.
JOBS = ("train/pretrain", "data/tokenize", "hf/import", "generate")

SNIPPETS = (
    "\t",
    "  ",
    ":",
    ": ",
    "- ",
    "-",
    "{",
    "}",
    "[",
    "]",
    ",",
    "'",
    '"',
    "#",
    "&anchor ",
    "*anchor",
    "<<: *anchor\n",
    "!!python/object:os.system ",
    "!!binary ",
    "!!int ",
    "? ",
    "---\n",
    "...\n",
    "%YAML 1.1\n",
    "${oc.env:HOME}",
    "${training.steps}",
    "${",
    "\n",
    "\x00",
    "\ufeff",
    "9" * 5000,
    ".nan",
    "-.inf",
    "~",
    "training:\n  steps: 1\ntraining:\n  steps: 2\n",
)


def written_config(job: str, folder: Path) -> str:
    """The YAML ``theseus configure JOB`` writes (every key with its default)."""
    from theseus.cli.running import selected_job
    from theseus.config import write_yaml

    _, schema, _, _ = selected_job(job, None, [])
    path = write_yaml(schema.defaults(), folder / f"{job.replace('/', '-')}.yaml", schema)
    return path.read_text()


def mutation() -> st.SearchStrategy[tuple[str, float, str]]:
    """``(operation, where: a fraction of the text, what)``."""
    operation = st.sampled_from(("insert", "replace-value", "delete", "truncate", "double-line", "indent"))
    return st.tuples(operation, st.floats(0, 1), st.one_of(st.sampled_from(SNIPPETS), hostile_text()))


def mutate(text: str, operations: list[tuple[str, float, str]]) -> str:
    for operation, where, what in operations:
        at = int(where * len(text))
        lines = text.splitlines(keepends=True) or [""]
        row = min(int(where * len(lines)), len(lines) - 1)
        if operation == "insert":
            text = text[:at] + what + text[at:]
        elif operation == "delete":
            text = text[:at] + text[at + 1 + len(what) % 7 :]
        elif operation == "truncate":
            text = text[:at]
        elif operation == "replace-value" and ":" in lines[row]:
            head = lines[row].split(":", 1)[0]
            lines[row] = f"{head}: {what}\n"
            text = "".join(lines)
        elif operation == "double-line":
            lines.insert(row, lines[row])
            text = "".join(lines)
        elif operation == "indent":
            lines[row] = (what if what.isspace() else " " * (len(what) % 5)) + lines[row]
            text = "".join(lines)
    return text


def test_mutated_config_files_are_read_or_refused_in_one_line(tmp_path: Path) -> None:
    bases = {job: written_config(job, tmp_path) for job in JOBS}
    config = tmp_path / "config.yaml"
    tally: Counter[str] = Counter()

    @fuzz_settings(max_examples=250)
    @given(
        job=st.sampled_from(JOBS),
        operations=st.lists(mutation(), min_size=1, max_size=3),
        raw=st.one_of(st.none(), st.binary(min_size=1, max_size=4)),
    )
    def check(job: str, operations: list[tuple[str, float, str]], raw: bytes | None) -> None:
        data = mutate(bases[job], operations).encode("utf-8", errors="surrogatepass")
        if raw is not None:  # bytes as they come, UTF-8 or not, somewhere in the file
            at = len(data) // 2
            data = data[:at] + raw + data[at:]
        config.write_bytes(data)
        attempt(tally, validate, job, tmp_path / "root", config_file=config)

    check()
    assert sum(tally.values()) >= 250 and tally[ACCEPTED] and tally[ONE_LINE]


def test_hostile_text_as_a_whole_config_file_is_refused_in_one_line_or_read(tmp_path: Path) -> None:
    """Each hostile text, and each snippet, as the whole file."""
    config = tmp_path / "config.yaml"
    tally: Counter[str] = Counter()
    for text in (*HOSTILE_TEXT, *SNIPPETS, "[" * 1200, "a: " * 1200):
        config.write_text(text, encoding="utf-8", errors="surrogatepass")
        attempt(tally, validate, "train/pretrain", tmp_path / "root", config_file=config)
    assert tally[ONE_LINE] >= len(HOSTILE_TEXT) // 2
