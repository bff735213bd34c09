"""docs/writing-a-plugin.md's flows, as written: a new plugin installed and tested, jobs from a plain file."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

from tests.docs.doc_flows import Shell
from tests.docs.flow_common import flows

#: pip settings for the plugin flow: ``pip install ./NAME`` puts the built wheel's files into a
#: throwaway folder (``PIP_TARGET``, added by the test) without resolving dependencies (the theseus
#: distributions are installed already) and builds with the installed hatchling instead of an
#: isolated environment that would need an index (``PIP_NO_BUILD_ISOLATION=0`` is pip's spelling of
#: ``--no-build-isolation``: the value goes to its ``build_isolation`` setting). ``PYTHONPATH``
#: (added by the test) makes the folder visible to ``theseus`` and ``pytest``.
PIP_INTO_FOLDER = {"PIP_NO_DEPS": "1", "PIP_NO_BUILD_ISOLATION": "0"}


@pytest.mark.slow
def test_new_plugin_flow(tmp_path: Path) -> None:
    site = tmp_path / "site"
    shell = Shell.create(tmp_path / "work", **PIP_INTO_FOLDER, PIP_TARGET=str(site), PYTHONPATH=str(site))
    shell.run(flows("docs/writing-a-plugin.md")["new-plugin"])

    made = shell.result("theseus new plugin").stdout
    assert made.startswith("created theseus-wordcount (13 files):")
    assert "next: pip install './theseus-wordcount[test]' && theseus jobs" in made  # the page's own commands
    assert (site / "theseus_wordcount-0.1.0.dist-info").is_dir()
    with pytest.raises(metadata.PackageNotFoundError):  # the project's environment is untouched
        metadata.distribution("theseus-wordcount")

    jobs = shell.result("theseus jobs")
    assert ["wordcount/train", "theseus-wordcount", "0.1.0"] in jobs.lines() and not jobs.stderr
    plugins = shell.result("theseus plugins")
    row = [line for line in plugins.lines() if line[:1] == ["theseus-wordcount"]]
    assert row == [["theseus-wordcount", "0.1.0", ">=0.1,<0.2", "1", "5", "theseus_metrics_sinks", "ok"]]
    assert not plugins.stderr
    # the generated tests: the job trains 3 steps on the plugin's objective, both environments play and score
    assert re.search(r"^=+ 7 passed in ", shell.result("cd theseus-wordcount && pytest").stdout, re.MULTILINE)


@pytest.mark.slow
def test_jobs_from_a_plain_file_flow(tmp_path: Path) -> None:
    shell = Shell.create(tmp_path / "work")
    (done,) = shell.run(flows("docs/writing-a-plugin.md")["load-file"])
    assert (shell.cwd / "my_jobs.py").read_text().startswith("from theseus.base.job import Job")
    assert done.stdout.splitlines()[-1:] == ["hello"]
