"""Generated bad values for every configuration key of every installed job: each is accepted by the
validation a run does before it trains (selection, types, bounds, paths, building the job) or refused
in one line; through ``theseus configure``, exit 0 or exit 2 with one ``error:`` line.

Three ways a value arrives: ``key=value`` text on the command line, a typed value of a YAML file or of
a Python mapping (``BaseTrainer.create``), and the ``theseus configure`` command itself.
"""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from functools import cache
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.reliability.fuzzing import (
    ACCEPTED,
    HOSTILE_TEXT,
    ONE_LINE,
    attempt,
    fuzz_settings,
    hostile_text,
    hostile_value,
    validate,
)
from theseus.config.fields import FieldSpec

#: The distributions whose jobs are fuzzed: this repository's, so that another installed plugin (or a job
#: registered in-process by an earlier test) cannot shift which key a generated example picks.
DISTRIBUTIONS = ("theseus-core", "theseus-data", "theseus-models", "theseus-plugins-example")


@cache
def installed_keys() -> tuple[tuple[str, FieldSpec], ...]:
    """``(job, field)`` for every key of every job the repository's distributions register, sorted by job
    and key (a schema iterates its keys in order), whatever the order of entry points."""
    from theseus.cli.running import selected_job
    from theseus.registry import get_registry

    registry = get_registry()
    names = sorted(name for name, entry in registry.jobs.items() if entry.distribution in DISTRIBUTIONS)
    return tuple((name, spec) for name in names for spec in selected_job(name, None, [])[1])


def configure_cli(args: list[str]) -> tuple[int, str]:
    """``theseus ARGS`` in this process: ``(exit code, stderr)``."""
    from theseus.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, err.getvalue()


def test_every_key_of_every_job_takes_hostile_text_or_refuses_it_in_one_line(tmp_path: Path) -> None:
    """Each key of each installed job gets one of the hostile texts (the next one for the next key)."""
    cases = installed_keys()
    assert len({job for job, _ in cases}) >= 15 and len(cases) >= 1000  # every installed job, not a few
    tally: Counter[str] = Counter()
    for index, (job, spec) in enumerate(cases):
        text = HOSTILE_TEXT[index % len(HOSTILE_TEXT)]
        attempt(tally, validate, job, tmp_path, (f"{spec.key}={text}",))
    assert tally[ACCEPTED] and tally[ONE_LINE]
    assert sum(tally.values()) == len(cases)


def test_generated_override_text_is_accepted_or_one_line(tmp_path: Path) -> None:
    tally: Counter[str] = Counter()

    @fuzz_settings(max_examples=300)
    @given(case=st.sampled_from(installed_keys()), text=hostile_text())
    def check(case: tuple[str, FieldSpec], text: str) -> None:
        job, spec = case
        attempt(tally, validate, job, tmp_path, (f"{spec.key}={text}",))

    check()
    assert sum(tally.values()) >= 300 and tally[ACCEPTED] and tally[ONE_LINE]


def test_generated_typed_values_are_accepted_or_one_line(tmp_path: Path) -> None:
    """Typed values (None, NaN, infinity, integers beyond a float, nested lists and mappings), one to three
    keys of a job at once."""
    tally: Counter[str] = Counter()

    keys_of: dict[str, list[FieldSpec]] = {}
    for job, spec in installed_keys():
        keys_of.setdefault(job, []).append(spec)
    more_keys = {job: st.lists(st.sampled_from(specs), max_size=2) for job, specs in keys_of.items()}

    @fuzz_settings(max_examples=300)
    @given(data=st.data(), case=st.sampled_from(installed_keys()))
    def check(data: st.DataObject, case: tuple[str, FieldSpec]) -> None:
        job, spec = case
        values = {s.key: data.draw(hostile_value()) for s in [spec, *data.draw(more_keys[job])]}
        attempt(tally, validate, job, tmp_path, values=values, lines=len(values))

    check()
    assert sum(tally.values()) >= 300 and tally[ACCEPTED] and tally[ONE_LINE]


def test_theseus_configure_exits_0_or_2_with_one_line_and_what_it_writes_reads_back(tmp_path: Path) -> None:
    """``theseus configure JOB OUT key=value``: exit 2 with one ``error:`` line, or exit 0 and a file that
    ``--config`` reads back to the same configuration."""
    from theseus.cli.running import selected_job
    from theseus.config import MISSING, read_yaml
    from theseus.config.types import coerce

    out = tmp_path / "out.yaml"
    tally: Counter[str] = Counter()

    @fuzz_settings(max_examples=100)
    @given(case=st.sampled_from(installed_keys()), text=hostile_text())
    def check(case: tuple[str, FieldSpec], text: str) -> None:
        job, spec = case
        out.unlink(missing_ok=True)
        code, err = configure_cli(["configure", job, str(out), f"{spec.key}={text}"])
        if code == 2:
            assert "Traceback" not in err
            assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
            tally[ONE_LINE] += 1
            return
        assert code == 0 and not err, (code, err)
        _, schema, _, given_values = selected_job(job, None, [f"{spec.key}={text}"])
        expected = {**schema.defaults(), **{k: coerce(v, schema[k].type, k) for k, v in given_values.items()}}
        written = read_yaml(out)
        assert set(written) == set(expected)
        for key, value in written.items():
            again = MISSING if value == "???" else coerce(value, schema[key].type, key)
            assert again == expected[key] or again is expected[key], (key, value, expected[key])
        tally[ACCEPTED] += 1

    check()
    assert sum(tally.values()) >= 100 and tally[ACCEPTED] and tally[ONE_LINE]
