"""Every command flow the docs pages show runs as written, through the installed ``theseus`` command:
the extraction of the flows, and the list of which test runs which flow (``tests/docs/test_flow_<page>.py``,
one module per page so that they run in parallel).

The commands come from the pages themselves (``tests/docs/doc_flows.py`` extracts the blocks marked
``<!-- doc-flow: NAME -->``), so a changed page runs its changed commands. Each flow runs in a fresh
temporary working directory with ``THESEUS_ROOT`` inside it and the network off
(``doc_flows.OFFLINE``); the page's arguments are never changed or extended. The files a flow starts
from (a Hugging Face checkpoint folder, ``chat.jsonl``) are built by ``tests/docs/flow_common.py``:
tiny random GPT-2 and Llama models saved with ``save_pretrained`` beside byte-level BPE tokenizers
trained with ``tokenizers``.

One flow gets settings beyond the page, declared in ``test_flow_plugins.PIP_INTO_FOLDER``: pip's own
environment variables make ``pip install ./theseus-wordcount`` install into a throwaway folder on
``PYTHONPATH`` instead of the project's virtual environment.

Pages holding shell blocks but no flow are listed in ``NOT_RUN`` with the reason; a page with new
shell blocks, or a new flow without a test here, fails ``test_every_flow_runs_and_every_page_is_considered``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.docs.doc_flows import Step, commands, page_flows, shell_pages, strip_comment

#: The flows the ``test_flow_*`` modules run, by page; ``test_every_flow_runs_and_every_page_is_considered`` checks
#: that they are exactly the flows marked in the docs.
RUN = {
    "docs/accelerators.md": {"plan", "one-chip"},
    "docs/adding-a-model-family.md": {"olmo3"},
    "docs/evaluation.md": {"harness"},
    "docs/fine-tuning.md": {"gpt2", "llama", "preference"},
    "docs/huggingface.md": {"local-folder"},
    "docs/tracking.md": {"runs"},
    "docs/multi-host.md": {"two-processes"},
    "docs/reinforcement-learning.md": {"grpo", "distill", "arithmetic", "reward", "calculator", "hf-policy"},
    "docs/writing-a-plugin.md": {"new-plugin", "load-file"},
}

#: Pages with shell blocks and no flow to run, and why.
NOT_RUN = {
    "README.md": "new virtual environments and pip installs of the distributions; `theseus run demo/gpt`, "
    "the full-size demo (minutes; tests/generation/test_demo.py runs it test-sized); the command summary has "
    "placeholders (JOB, NAME, A B)",
    "docs/index.md": "a new virtual environment and pip installs; `theseus run example/gpt/train`, a full-size run "
    "(about a minute); the command summary has placeholders (JOB, NAME)",
    "docs/adding-an-experiment.md": "one-line alternatives of full-size default runs (1000 steps each), not a "
    "sequence; FineWeb streamed from the hub; `--config run.yaml` of a 2000-step run",
    "docs/errors.md": "sample sessions of failures (a killed run, a typo) and their messages, not commands to follow",
    "docs/extend-a-trainer.md": "trains the guide's trainer with its full-size defaults",
    "docs/security.md": "two alternatives with a placeholder distribution name (some-plugin-dist)",
    "docs/sharding-design.md": "layouts for 8 or more devices (mesh/model=8, mesh/expert=8) of full-size runs",
    "theseus-data/README.md": "FineWeb from the hub or from downloaded parquet files, a BPE trained on the whole "
    "corpus; pip installs of the distribution",
    "theseus-models/README.md": "generation from the demo's run (demo-gpt), which the full-size demo trains",
    "theseus-plugins-example/README.md": "pip installs into the project's environment, a full-size example run "
    "(about a minute), the distribution's own test suite",
}


# --- the extraction ------------------------------------------------------------------------------


def test_commands_are_extracted_from_prompts_continuations_and_comments(tmp_path: Path) -> None:
    assert strip_comment("theseus jobs   # every job") == "theseus jobs"
    assert (
        strip_comment("theseus run generate generate/prompt='a # b' # c")
        == "theseus run generate generate/prompt='a # b'"
    )
    assert strip_comment('x generate/prompt="#1"#2') == 'x generate/prompt="#1"#2'
    text = "$ theseus run a \\\n      b=1   # one\n$ theseus runs\nNAME  JOB\nx     y\n$ echo $?\n2\n"
    assert commands(text, "text") == [(0, "theseus run a b=1"), (2, "theseus runs"), (5, "echo $?")]
    bash = "# a comment\ntheseus run a \\\n    b=1\n\ncd x && pytest   # tests\n"
    assert commands(bash, "bash") == [(1, "theseus run a b=1"), (4, "cd x && pytest")]
    with pytest.raises(ValueError, match="ends inside a continued command"):
        commands("theseus run a \\\n", "bash")

    page = tmp_path / "page.md"
    page.write_text(
        "Intro.\n\n<!-- doc-flow: first -->\n```bash\ntheseus jobs\n```\n\n```bash\ntheseus run JOB ...\n```\n\n"
        "<!-- doc-flow: first file=my_jobs.py -->\n```python\nprint('hi')\n```\n\n"
        "<!-- doc-flow: second script -->\n```bash\nfor i in 0 1; do\n  echo $i &\ndone\nwait\n```\n\n"
        "<!-- doc-flow: first -->\n```text\n$ theseus --load my_jobs.py jobs\nmy/job\n```\n"
    )
    found = page_flows(page)
    assert sorted(found) == ["first", "second"]
    assert found["first"].steps == (
        Step("command", "theseus jobs", 5),
        Step("file", "print('hi')\n", 14, "my_jobs.py"),
        Step("command", "theseus --load my_jobs.py jobs", 27),
    )
    assert found["first"].commands == ["theseus jobs", "theseus --load my_jobs.py jobs"]
    assert found["second"].steps == (Step("script", "for i in 0 1; do\n  echo $i &\ndone\nwait\n", 19),)

    for bad, message in [
        ("<!-- doc-flow: x -->\n\n```bash\ntheseus jobs\n```\n", "not on the line just above"),
        ("<!-- doc-flow: x loud -->\n```bash\ntheseus jobs\n```\n", "unknown doc-flow option 'loud'"),
        ("<!-- doc-flow: x -->\n```python\nprint()\n```\n", "marks a python block"),
        ("<!-- doc-flow: x -->\n```text\nsample output only\n```\n", "without commands"),
    ]:
        page.write_text(bad)
        with pytest.raises(ValueError, match=message):
            page_flows(page)


def test_every_flow_runs_and_every_page_is_considered() -> None:
    marked = {}
    for page in shell_pages():
        name = page.relative_to(REPO).as_posix()
        names = set(page_flows(page))
        if names:
            marked[name] = names
        else:
            assert name in NOT_RUN, f"{name} shows shell commands: mark its flows and run them here, or say why not"
    assert marked == RUN
    assert not set(NOT_RUN) & set(RUN)
    assert all((REPO / page).is_file() for page in NOT_RUN)
    # the other pages really hold shell blocks (a page losing them leaves the list)
    assert set(NOT_RUN) <= {p.relative_to(REPO).as_posix() for p in shell_pages()}
