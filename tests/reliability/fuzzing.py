"""What the property-based bad-input tests share: derandomized hypothesis settings, hostile values,
and ``attempt``, which sorts an outcome into accepted, one-line error, or a failure (anything else).

A case that ends in an exception other than a ``TheseusError`` (a traceback for the user), or in a
``TheseusError`` whose message is empty or spans lines, fails the test with the generated input.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from theseus.errors import TheseusError

ACCEPTED = "accepted"
ONE_LINE = "one-line error"


def fuzz_settings(max_examples: int) -> settings:
    """The same cases on every machine and every run: derandomized (seeded by the test's source, not by
    the clock, ``--hypothesis-seed`` or a hash seed), no example database, the phases named rather than
    taken from a loaded profile; no per-example deadline. Strategies draw from sorted sequences, never
    from a set or a registry's order."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


def attempt(tally: Counter[str], action: Callable[..., Any], *args: Any, lines: int = 1, **kwargs: Any) -> str:
    """Run ``action(*args, **kwargs)``: ``ACCEPTED`` when it returns, ``ONE_LINE`` for a one-line
    ``TheseusError``; any other exception propagates (the generated input is then reported by hypothesis).

    ``lines``: how many bad values the input holds; values that break their bounds are reported together,
    one ``error:`` line each (as the command line prints them), so a message may have that many lines.
    """
    try:
        action(*args, **kwargs)
    except TheseusError as exc:
        message = str(exc)
        assert message.strip(), f"{type(exc).__name__} with an empty message"
        first, *more = message.split("\n")
        assert "\r" not in message and first.strip(), f"not a line: {message!r}"
        assert len(more) < lines and all(line.startswith("error: ") for line in more), f"several lines: {message!r}"
        tally[ONE_LINE] += 1
        return ONE_LINE
    tally[ACCEPTED] += 1
    return ACCEPTED


#: Text a user could type for any key: empty, blanks, not numbers, numbers beyond every bound,
#: non-finite numbers, unicode, paths that climb out with ``..``, YAML and OmegaConf syntax.
HOSTILE_TEXT: tuple[str, ...] = (
    "",
    " ",
    "\t",
    "none",
    "null",
    "~",
    "???",
    "nan",
    "NaN",
    ".nan",
    "inf",
    "-inf",
    "-.inf",
    "1e309",
    "-1e309",
    "1e-330",
    "-1",
    "0",
    "-0.0",
    "1.5",
    "true",
    "no",
    "9" * 40,
    "-" + "9" * 40,
    "9" * 5000,
    "0x1F",
    "1_000",
    "2:30",
    "[]",
    "{}",
    "[1, [2, 3]]",
    "{a: {b: 1}}",
    "[",
    "{",
    "- x",
    "a: b",
    "${oc.env:HOME}",
    "${nope}",
    "!!python/object/apply:os.system ['true']",
    "&a x",
    "*a",
    "..",
    "../..",
    "../../../etc/passwd",
    "~/../../x",
    "./a/../../b",
    "/",
    "hf:..",
    "hf:../../x",
    "run:..",
    "run:../x@1",
    "run:x@-1",
    "run:x@nan",
    "a,b,,c",
    ",",
    "model/gpt",
    "ünïcödé",
    "名前",
    "🙂" * 3,
    "\u202e\u200b",
    "x" * 300,
    "line\nbreak",
    "tab\there",
    "null\x00byte",
    "'quoted'",
    '"',
)


@cache  # one strategy object: hypothesis validates a strategy the first time it draws from it
def hostile_text() -> st.SearchStrategy[str]:
    """The fixed hostile texts, numbers of every size as text, and arbitrary unicode."""
    return st.one_of(
        st.sampled_from(HOSTILE_TEXT),
        st.integers(min_value=-(2**80), max_value=2**80).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.text(max_size=24),
        st.text(alphabet="./~-_:,@[]{}!&*$ 0123456789abcdefxyz", max_size=16),
    )


@cache
def hostile_value() -> st.SearchStrategy[Any]:
    """Typed values as a YAML file or a Python mapping can hold them: every scalar type, NaN and infinity,
    integers beyond a float, empty and nested collections, and the hostile texts."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([10**400, -(10**400), 2**63, -(2**63) - 1]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-320]),
        hostile_text(),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
        max_leaves=6,
    )


def validate(
    job: str,
    root: Path,
    overrides: tuple[str, ...] = (),
    values: dict[str, Any] | None = None,
    config_file: Path | None = None,
) -> None:
    """What ``theseus run`` does before the job runs: read the config file, select, resolve (types, bounds,
    absolute paths) and build the job; ``values`` arrive as ``BaseTrainer.create``'s mapping would."""
    from theseus.base.job import JobContext
    from theseus.config import configuration, parse_overrides, read_yaml
    from theseus.config.configuration import flat_values
    from theseus.config.paths import resolve_absolute
    from theseus.registry import get_registry

    cls: Any = get_registry().load_job(job)
    file_values = read_yaml(config_file) if config_file is not None else {}
    if values is not None:
        file_values = flat_values(values, "the configuration")
    chosen, file_values, given = cls.selected(file_values, parse_overrides(list(overrides)), root)
    cfg = resolve_absolute(chosen.schema(), file_values, given)
    with configuration(cfg):
        chosen(JobContext(name=job, root=root, config=cfg))
