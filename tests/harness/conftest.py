"""lm-evaluation-harness test helpers: local task YAMLs over JSONL files (nothing is downloaded), a
tiny random GPT-2 saved with ``save_pretrained`` and imported as a theseus run, and the CLI in process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")

from tests.huggingface.conftest import save_model

#: What every harness test runs under: datasets and the hub offline, jax on the CPU.
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "JAX_PLATFORMS": "cpu"}

#: The model's context: short enough that rolling texts take several windows and long contexts are cut.
POSITIONS = 48

CHOICES = [
    {"question": "A week has seven", "choices": [" days", " wheels", " oceans"], "answer": 0},
    {"question": "The sky is", "choices": [" blue", " loud", " square"], "answer": 0},
    {"question": "Two plus two is", "choices": [" four", " nine"], "answer": 0},
    {"question": "", "choices": ["cats", "dogs"], "answer": 1},  # an empty context: the prefix token
    {"question": "Fire is  ", "choices": ["hot", "cold"], "answer": 0},  # trailing spaces move to the choice
    {
        "question": "A question long enough that its context is cut from the left to fit:",
        "choices": [" a", " b"],
        "answer": 1,
    },
]
PROMPTS = [
    {"prompt": "def f(x):", "target": " return"},
    {"prompt": "Question: 1+1=", "target": "2"},
    {"prompt": "import os\nimport", "target": " sys"},
    {"prompt": "The quick brown fox jumps over the lazy dog and then, much later,", "target": " runs"},
]
TEXTS = [
    {"text": "The quick brown fox jumps over the lazy dog. A second sentence."},
    {"text": "Hello world"},
    {"text": "Several windows of the model's context score this text, every token once."},
]


def dataset(folder: Path, name: str, rows: list[dict[str, Any]]) -> str:
    """Write ``rows`` as ``folder/name.jsonl``; the YAML lines of a task reading it as its test split."""
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {path}\ntest_split: test\n"


def write_tasks(folder: Path) -> Path:
    """``tiny_choice`` (multiple choice), ``tiny_generate`` (generate_until with stop strings) and
    ``tiny_rolling`` (loglikelihood_rolling) in ``folder``, each over its own JSONL file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny_choice.yaml").write_text(
        "task: tiny_choice\n" + dataset(folder, "choice", CHOICES) + "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    (folder / "tiny_generate.yaml").write_text(
        "task: tiny_generate\n" + dataset(folder, "generate", PROMPTS) + "output_type: generate_until\n"
        'doc_to_text: "{{prompt}}"\ndoc_to_target: "{{target}}"\n'
        'generation_kwargs:\n  until: ["\\n", ">", "a"]\n  max_gen_toks: 10\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n"
    )
    (folder / "tiny_rolling.yaml").write_text(
        "task: tiny_rolling\n" + dataset(folder, "rolling", TEXTS) + "output_type: loglikelihood_rolling\n"
        'doc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
    )
    return folder


@pytest.fixture(scope="session")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The offline settings (and a datasets cache of its own) for this process; returns them for subprocesses."""
    values = {**OFFLINE, "HF_DATASETS_CACHE": str(tmp_path_factory.mktemp("hf-datasets"))}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in values.items():
            patch.setenv(key, value)
        yield values


def logliks(resps: list[Any]) -> list[float]:
    """The log-likelihoods of one sample's responses (as lm-eval writes them, or as it returns them)."""
    values = []
    for resp in resps:
        first = resp[0]
        values.append(float(first[0] if isinstance(first, (list, tuple)) else first))
    return values


def theseus_main(*args: str) -> int:
    """``theseus ARGS`` in this process; the exit code."""
    from theseus.cli.main import main

    try:
        main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@dataclass
class Imported:
    """A theseus run ``tiny`` imported from a random GPT-2 (``source``), and local tasks."""

    root: Path
    source: Path
    tasks: Path
    run: str = "tiny"


@pytest.fixture(scope="session")
def imported(tmp_path_factory: pytest.TempPathFactory, offline: dict[str, str]) -> Imported:
    """A 2-layer, 32-wide GPT-2 with well-spread random weights (clear greedy choices) and a byte-level
    tokenizer, imported with ``theseus run hf/import``."""
    folder = tmp_path_factory.mktemp("harness")
    source = folder / "source"
    save_model(source, "gpt2", vocab_size=300, n_positions=POSITIONS)
    root = folder / "root"
    code = theseus_main("run", "hf/import", f"hf/source={source}", "run/name=tiny", "--root", str(root))
    assert code == 0
    return Imported(root, source, write_tasks(folder / "tasks"))
