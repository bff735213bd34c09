"""The schema follows the selection; bad names, keys of unselected components, restrictions, YAML."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from theseus.cli.main import main
from theseus.config import read_yaml
from theseus.errors import ConfigError
from theseus.training import selection
from theseus.training.pretrain import Pretrain


def theseus(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_configure_writes_the_selected_components_keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "lion.yaml"
    code, _, err = theseus(capsys, "configure", "train/pretrain", str(out), "optimizer=lion", "schedule=cosine")
    assert code == 0, err
    values = read_yaml(out)
    assert values["select/optimizer"] == "lion" and values["select/schedule"] == "cosine"
    # the selected components' keys, and the trainer's own optimizer-state keys that serve any optimizer
    assert {k for k in values if k.startswith(("optimizer/", "schedule/"))} == {
        "optimizer/state_dtype",
        "optimizer/offload",
        "optimizer/offload_keep_gb",
        "optimizer/lion/beta1",
        "optimizer/lion/beta2",
        "optimizer/lion/weight_decay",
        "schedule/cosine/min_lr_ratio",
        "schedule/cosine/warmup_fraction",
    }
    # The trainer's declarations are the defaults, written by name.
    defaults = tmp_path / "defaults.yaml"
    assert theseus(capsys, "configure", "train/pretrain", str(defaults))[0] == 0
    assert {k: v for k, v in read_yaml(defaults).items() if k.startswith("select/")} == {
        "select/model": "gpt",
        "select/optimizer": "adamw",
        "select/schedule": "wsd",
        "select/dataset": "python-stdlib:1:pmd",
        "select/evaluation": "perplexity",
        "select/analysis": "",
        "select/objective": "cross_entropy",
    }
    # The written file selects lion again when read back: nothing else is needed.
    chosen, _file_values, _ = Pretrain.selected(read_yaml(out), {})
    assert chosen.optimizer().name == "lion" and getattr(chosen.schedule(), "name", None) == "cosine"
    assert chosen.__qualname__ == "Pretrain" and Pretrain.optimizer().name == "adamw"
    # ... and selecting another optimizer over that file names the keys that no longer apply.
    with pytest.raises(
        ConfigError, match=r"^optimizer/lion/beta1 belongs to optimizer 'lion'; this run selects 'adamw'"
    ):
        Pretrain.selected(read_yaml(out), {"optimizer": "adamw"})


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["optimizer=lino"],
            "error: unknown optimizer 'lino' (optimizer=lino); did you mean 'lion'? registered optimizers: "
            "adamw, lion, muon, sgd (theseus-core); example-nadamw (theseus-plugins-example)",
        ),
        (["schedule=cosin"], "error: unknown schedule 'cosin' (schedule=cosin); did you mean 'cosine'?"),
        (["model=lama"], "error: unknown model 'lama' (model=lama); did you mean 'llama'?"),
        (["evaluation=perplexity,nope"], "error: unknown evaluation 'nope' (evaluation=perplexity,nope); registered"),
        (
            ["analysis=zzz"],
            "error: unknown analysis 'zzz' (analysis=zzz); registered analyses: activations (theseus-core)",
        ),
        (["dataset=fineweeb"], "error: unknown dataset 'fineweeb' (dataset=fineweeb); did you mean 'fineweb'?"),
        (
            ["dataset=python-stdlib:0.5,fineweb:0.4"],
            "error: sampling rates (python-stdlib=0.5, fineweb=0.4) sum to 0.9; make them sum to 1 "
            "(dataset=python-stdlib:0.5,fineweb:0.4)",
        ),
        (["dataset=python-stdlib:x"], "error: dataset entry 'python-stdlib:x' (dataset=python-stdlib:x): the rate 'x'"),
        (
            ["dataset=python-stdlib:1:zigzag"],
            "error: Sampling style 'zigzag' for python-stdlib is not one of pmd, padded",
        ),
        (
            ["optimizer=lion", "optimizer/adamw/eps=1e-6"],
            "error: optimizer/adamw/eps belongs to optimizer 'adamw'; this run selects 'lion' (optimizer=lion)",
        ),
        (
            ["optimizer/sgd/momentum=0.5"],
            "error: optimizer/sgd/momentum belongs to optimizer 'sgd'; this run selects 'adamw' (optimizer=adamw)",
        ),
        (
            ["evaluation=", "evaluation/perplexity/batches=2"],
            "error: evaluation/perplexity/batches belongs to evaluation 'perplexity'; this run selects none "
            "(evaluation=)",
        ),
        (
            ["data/fineweb/subset=x"],
            "error: data/fineweb/subset belongs to dataset 'fineweb'; this run selects 'python-stdlib' "
            "(dataset=python-stdlib:1:pmd)",
        ),
        (
            ["select/modle=gpt"],
            "error: unknown configuration key 'select/modle' (override); did you mean 'select/model'?",
        ),
        (
            ["optimizer="],
            "error: optimizer= needs a registered name; list them with 'theseus components --kind optimizer'",
        ),
    ],
)
def test_bad_selections_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], line: str
) -> None:
    code, out, err = theseus(capsys, "run", "train/pretrain", *args, "--root", str(tmp_path))
    assert code == 2, out + err
    assert len(err.splitlines()) == 1 and err.startswith(line), err
    assert not any(tmp_path.iterdir())


def test_a_key_of_an_unselected_model_names_the_model() -> None:
    class LlamaPretrain(Pretrain):
        MODEL: ClassVar[Any] = "llama"

    with pytest.raises(ConfigError) as caught:
        LlamaPretrain.selected({}, {"model": "gpt", "architecture/rope_theta": 5.0})
    assert str(caught.value) == "architecture/rope_theta belongs to model 'llama'; this run selects 'gpt' (model=gpt)"
    with pytest.raises(ConfigError) as caught:  # models neither declared nor selected: named, sorted
        Pretrain.selected({}, {"architecture/rope_theta": 5.0})
    named = "architecture/rope_theta belongs to models 'deepseek_v3', 'deepseek_v32', 'falcon_h1', 'gemma2' and "
    assert str(caught.value).startswith(named)
    assert str(caught.value).endswith(" more; this run selects 'gpt' (model=gpt)")
    with pytest.raises(ConfigError) as caught:  # a key of mixtures only, on a dense model
        Pretrain.selected({}, {"architecture/moe/n_experts": 8})
    expected = (
        "architecture/moe/n_experts belongs to models 'deepseek_v3', 'deepseek_v32', 'glm4_moe', 'glm_moe_dsa' "
        "and 10 more; this run selects 'gpt' (model=gpt)"
    )
    assert str(caught.value) == expected
    chosen, _, _given = LlamaPretrain.selected({}, {"architecture/rope_theta": 5.0})
    assert chosen is LlamaPretrain and selection.schema_of(chosen)["select/model"].default == "llama"


def test_a_trainer_restricts_what_a_run_may_select(capsys: pytest.CaptureFixture[str]) -> None:
    class GPTOnly(Pretrain):
        ACCEPTS: ClassVar[dict[str, list[str]]] = {"model": ["gpt", "llama"], "optimizer": ["adamw"]}

    assert GPTOnly.selected({}, {"model": "llama"})[0].MODEL.__name__ == "Llama"
    with pytest.raises(ConfigError) as caught:
        GPTOnly.selected({}, {"model": "example-scaled-gpt"})
    assert str(caught.value) == (
        "GPTOnly does not accept model 'example-scaled-gpt'; it accepts: gpt, llama (its ACCEPTS declaration)"
    )
    with pytest.raises(ConfigError, match="does not accept optimizer 'lion'; it accepts: adamw"):
        GPTOnly.selected({}, {"select/optimizer": "lion"})


def test_yaml_selects_under_select_or_by_the_bare_kind(tmp_path: Path) -> None:
    nested = tmp_path / "nested.yaml"
    nested.write_text("select:\n  optimizer: sgd\n  evaluation: []\noptimizer:\n  sgd:\n    momentum: 0.5\n")
    chosen, file_values, _ = Pretrain.selected(read_yaml(nested), {})
    assert chosen.optimizer().name == "sgd" and chosen.EVALUATION == []
    assert file_values["select/evaluation"] == "" and file_values["optimizer/sgd/momentum"] == 0.5
    trainer = Pretrain.create(tmp_path, {"optimizer": "muon", "evaluation": ["perplexity"], "training": {"lr": 0.01}})
    assert type(trainer).optimizer().name == "muon" and trainer.args.lr == 0.01
    assert trainer.context.config["select/optimizer"] == "muon"
    with pytest.raises(ConfigError, match="select/optimizer is given twice"):
        selection.normalize({"optimizer": "lion", "select/optimizer": "sgd"})


def test_resume_check_names_old_and_new() -> None:
    selection.check_resume(None, {"select/model": "gpt"}, "r")
    selection.check_resume({"training/lr": 1.0}, {"select/model": "gpt"}, "r")  # a run from before selections
    selection.check_resume({"select/model": "gpt"}, {"select/model": "gpt"}, "r")
    with pytest.raises(ConfigError, match=r"^run 'r' was started with model='gpt'; this run selects model='llama'"):
        selection.check_resume({"select/model": "gpt"}, {"select/model": "llama"}, "r")


def recorded_run(root: Path, name: str, model: str) -> None:
    """A run folder whose provenance records ``model`` (all the selection reads of it)."""
    folder = root / "runs" / name
    folder.mkdir(parents=True)
    (folder / "provenance.json").write_text(json.dumps({"model": model}))


def test_a_run_from_init_from_trains_the_model_its_source_holds(tmp_path: Path) -> None:
    from theseus.model.models import GPT, Llama

    recorded_run(tmp_path, "llama", "theseus.model.models.llama.model:Llama")
    recorded_run(tmp_path, "qwen3", "theseus.model.models.qwen3.model:Qwen3")
    recorded_run(tmp_path, "gpt", "theseus.model.models.gpt.model:GPT")

    def model_of(trainer: Any, source: str, **given: Any) -> Any:
        chosen, _, overrides = trainer.selected({}, {"training/init_from": f"run:{source}", **given}, tmp_path)
        return chosen.MODEL, overrides.get("select/model")

    class LlamaTrainer(Pretrain):
        MODEL: ClassVar[Any] = "llama"

    class ScaledGPT(GPT):  # a plugin's model built on GPT: a GPT run initialises it as it is
        pass

    class ScaledTrainer(Pretrain):
        MODEL: ClassVar[Any] = ScaledGPT

    assert model_of(Pretrain, "llama") == (Llama, "llama")  # declared gpt, the source's llama trains
    assert model_of(LlamaTrainer, "qwen3")[1] == "qwen3"  # Qwen3 builds on Llama: still the source's
    assert model_of(ScaledTrainer, "gpt") == (ScaledGPT, None)  # the declared subclass of the source's
    assert model_of(Pretrain, "gpt") == ("gpt", None)  # the declared model itself: nothing to change
    assert model_of(Pretrain, "llama", model="gpt") == ("gpt", "gpt")  # chosen explicitly: kept (refused later)
    assert model_of(Pretrain, "missing") == ("gpt", None)  # the source cannot tell: opening it says why
