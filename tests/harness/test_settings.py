"""Generation settings as lm-eval's Hugging Face model reads them, stop strings, bucketed batches, flat
metrics, the run a job picks, and the one-line error without lm-eval installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.harness.conftest import Imported
from theseus.errors import ConfigError, TheseusError
from theseus.model.generation.sampling import SamplingParams
from theseus.model.harness.results import flat_metrics
from theseus.model.harness.settings import DEFAULT_MAX_GEN_TOKS, Settings, cut, settings

EOS = "<|endoftext|>"


def test_generation_settings_follow_lm_eval() -> None:
    greedy = settings({"until": "\n\n", "max_gen_toks": 32, "do_sample": False, "temperature": 0.7}, eos=EOS, where="t")
    assert greedy.until == ("\n\n", EOS) and greedy.max_gen_toks == 32 and greedy.greedy
    # defaults: greedy, 256 tokens, end-of-text only; aliases of the length in lm-eval's priority
    plain = settings(None, eos=EOS, where="t")
    assert plain.until == (EOS,) and plain.max_gen_toks == DEFAULT_MAX_GEN_TOKS and plain.greedy
    assert settings({"max_new_tokens": 5, "max_tokens": 9}, eos=EOS, where="t").max_gen_toks == 5
    # a temperature above 0 without do_sample samples, as in lm-eval
    sampled = settings({"temperature": 0.8, "top_p": 0.9, "top_k": 40, "num_beams": 1}, eos=EOS, where="t")
    assert sampled == Settings((EOS,), DEFAULT_MAX_GEN_TOKS, 0.8, 40, 0.9)
    assert sampled.sampling() == SamplingParams(temperature=0.8, top_k=40, top_p=0.9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"do_sample": True, "temperature": 0.7, "repetition_penalty": 1.3},
            "generation_kwargs.repetition_penalty=1.3",
        ),
        ({"num_beams": 4}, "generation_kwargs.num_beams=4, which theseus cannot honour"),
        ({"do_sample": True}, "do_sample=true with temperature=0"),
        ({"temperature": 0.5, "top_p": 2.0}, "generation_kwargs.top_p=2 must lie in (0, 1]"),
        ({"until": [1, 2]}, "generation_kwargs.until=[1, 2] must be a string or a list of strings"),
        ({"max_gen_toks": 0}, "generation_kwargs.max_gen_toks=0 must be at least 1"),
    ],
)
def test_settings_theseus_cannot_honour_are_one_error_naming_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^lm-eval task 'x'") as caught:
        settings(kwargs, eos=EOS, where="lm-eval task 'x'")
    assert message in str(caught.value)


def test_generated_text_is_cut_at_each_stop_string() -> None:
    assert cut("abc.def\nghi", ["\n", "."]) == "abc"
    assert cut("no stop here", ["", "\n"]) == "no stop here"


def test_flat_metrics_name_task_metric_and_filter() -> None:
    results = {
        "results": {
            "a": {"alias": "a", "acc,none": 0.5, "acc_stderr,none": 0.1, "ppl,none": 3.0, "ppl_stderr,none": "N/A"},
            "b": {"exact_match,strict-match": 1.0, "sample_len": 4},
        },
        "groups": {"g": {"acc,none": 0.25}},
        "n-samples": {"a": {"original": 9, "effective": 3}},
    }
    assert flat_metrics(results) == {
        "a/acc": 0.5,
        "a/acc_stderr": 0.1,
        "a/ppl": 3.0,
        "b/exact_match/strict-match": 1.0,
        "g/acc": 0.25,
        "a/samples": 3.0,
    }


def test_without_lm_eval_the_job_and_the_evaluation_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from theseus.model.harness.dependency import HarnessUnavailable, require_lm_eval
    from theseus.model.harness.evaluation import Harness

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # importing it now raises ImportError
    with pytest.raises(HarnessUnavailable) as caught:
        require_lm_eval()
    assert str(caught.value) == "eval/harness needs lm-evaluation-harness; pip install 'theseus-models[eval]'"
    assert isinstance(caught.value, TheseusError)
    with pytest.raises(HarnessUnavailable, match=r"^evaluation=harness needs lm-evaluation-harness; pip install"):
        Harness(tasks="x")


def test_batches_are_padded_to_few_bucketed_widths() -> None:
    from theseus.model.harness.scoring import bucket, order, row

    assert [bucket(n, 48) for n in (1, 16, 17, 33, 48)] == [16, 16, 32, 48, 48]
    assert order([([1], [2]), ([1, 2, 3], [4]), ([5], [6, 7])]) == [1, 2, 0]  # longest first
    # context cut from the left; only the continuation's positions are scored
    assert row(([1, 2, 3, 4, 5], [6, 7]), 4) == ([3, 4, 5, 6], [-1, -1, 6, 7])


def test_wider_padding_generates_the_same_tokens(imported: Imported) -> None:
    from theseus.model.generation import generate_tokens, load_run

    run = load_run(imported.root, imported.run)
    prompts = [[256, 100, 101], [256, 50]]
    plain = generate_tokens(run.model, run.params, prompts, 6, sampling=SamplingParams(temperature=0.0))
    wide = generate_tokens(run.model, run.params, prompts, 6, sampling=SamplingParams(temperature=0.0), width=16)
    assert plain == wide


def test_several_runs_need_eval_run(tmp_path: Path) -> None:
    from theseus.model.harness.jobs import parse_run

    for name in ("a", "b"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "config.yaml").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"several runs under .*; choose one with eval/run=<name> \(a, b\)"):
        parse_run(tmp_path, "")
    with pytest.raises(ConfigError, match=r"eval/run=a@x: after '@' comes a checkpoint step, e.g. a@1000"):
        parse_run(tmp_path, "a@x")
