"""Every command flow the docs pages show runs as written, through the installed ``theseus`` command.

The commands come from the pages themselves (``tests/docs/doc_flows.py`` extracts the blocks marked
``<!-- doc-flow: NAME -->``), so a changed page runs its changed commands. Each flow runs in a fresh
temporary working directory with ``THESEUS_ROOT`` inside it and the network off
(``doc_flows.OFFLINE``); the page's arguments are never changed or extended. The files a flow starts
from (a Hugging Face checkpoint folder, ``chat.jsonl``) are built here: tiny random GPT-2 and Llama
models saved with ``save_pretrained`` beside byte-level BPE tokenizers trained with ``tokenizers``.

One flow gets settings beyond the page, declared in ``PIP_INTO_FOLDER``: pip's own environment
variables make ``pip install ./theseus-wordcount`` install into a throwaway folder on
``PYTHONPATH`` instead of the project's virtual environment.

Pages holding shell blocks but no flow are listed in ``NOT_RUN`` with the reason; a page with new
shell blocks, or a new flow without a test here, fails ``test_every_flow_runs_and_every_page_is_considered``.
"""

from __future__ import annotations

import json
import re
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO
from tests.docs.doc_flows import Shell, Step, commands, page_flows, shell_pages, strip_comment
from tests.finetune.conftest import conversations, preference_rows, write_jsonl
from tests.huggingface.conftest import hf_logits, save_model
from tests.tracking.readers import jsonl_scalars, tensorboard_scalars, wandb_offline_run

#: The flows this module runs, by page; ``test_every_flow_runs_and_every_page_is_considered`` checks
#: that they are exactly the flows marked in the docs.
RUN = {
    "docs/evaluation.md": {"harness"},
    "docs/fine-tuning.md": {"gpt2", "llama", "preference"},
    "docs/huggingface.md": {"local-folder"},
    "docs/tracking.md": {"runs"},
    "docs/multi-host.md": {"two-processes"},
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
    "docs/sharding-design.md": "layouts for 8 or more devices (mesh/model=8) of full-size runs",
    "theseus-data/README.md": "FineWeb from the hub or from downloaded parquet files, a BPE trained on the whole "
    "corpus; pip installs of the distribution",
    "theseus-models/README.md": "generation from the demo's run (demo-gpt), which the full-size demo trains",
    "theseus-plugins-example/README.md": "pip installs into the project's environment, a full-size example run "
    "(about a minute), the distribution's own test suite",
}

#: pip settings for the plugin flow: ``pip install ./NAME`` puts the built wheel's files into a
#: throwaway folder (``PIP_TARGET``, added by the test) without resolving dependencies (the theseus
#: distributions are installed already) and builds with the installed hatchling instead of an
#: isolated environment that would need an index (``PIP_NO_BUILD_ISOLATION=0`` is pip's spelling of
#: ``--no-build-isolation``: the value goes to its ``build_isolation`` setting). ``PYTHONPATH``
#: (added by the test) makes the folder visible to ``theseus`` and ``pytest``.
PIP_INTO_FOLDER = {"PIP_NO_DEPS": "1", "PIP_NO_BUILD_ISOLATION": "0"}

CHAT_PROMPT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
MODEL_VOCAB = 320  # the models' vocabularies are padded beyond their tokenizers', as real checkpoints' are


def flows(page: str) -> dict[str, Any]:
    return page_flows(REPO / page)


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


# --- the files the flows start from --------------------------------------------------------------


def chat_rows() -> list[dict[str, Any]]:
    """Short conversations; every eighth is marked for the validation split (``"split": "val"``)."""
    rows = conversations(64)
    for index, row in enumerate(rows):
        if index % 8 == 7:
            row["split"] = "val"
    return rows


def save_bpe_tokenizer(folder: Path, texts: list[str], *, vocab_size: int, bos: bool) -> int:
    """A byte-level BPE trained on ``texts`` (``<|endoftext|>`` = 0, ``<s>`` = 1), saved as a
    transformers fast tokenizer; with ``bos`` every text starts with ``<s>``, as Llama's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", bos_token="<s>" if bos else "<|endoftext|>"
    )
    fast.save_pretrained(folder)
    return tokenizer.get_vocab_size()


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``gpt2/`` and ``llama/`` (random 2-layer, 32-wide models, save_pretrained, BPE tokenizers)
    and ``chat.jsonl``: what the fine-tuning and Hugging Face pages start from."""
    folder = tmp_path_factory.mktemp("doc-flow-sources")
    rows = chat_rows()
    (folder / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    texts = [m["content"] for row in rows for m in row["messages"]] + [CHAT_PROMPT, "The meaning of life"]
    # the special ids of the tokenizers below: <|endoftext|> = 0 ends texts, Llama's texts start with <s> = 1
    gpt2 = {"n_positions": 128, "bos_token_id": 0, "eos_token_id": 0}
    llama = {"max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 0}
    save_model(folder / "gpt2", "gpt2", tokenizer=False, vocab_size=MODEL_VOCAB, **gpt2)
    save_model(folder / "llama", "llama", tokenizer=False, vocab_size=MODEL_VOCAB, **llama)
    assert save_bpe_tokenizer(folder / "gpt2", texts, vocab_size=300, bos=False) == 300
    assert save_bpe_tokenizer(folder / "llama", texts, vocab_size=280, bos=True) == 280
    return folder


def copy_into(shell: Shell, sources: Path, *names: str, rename: dict[str, str] | None = None) -> None:
    for name in names:
        target = shell.cwd / (rename or {}).get(name, name)
        if (sources / name).is_dir():
            shutil.copytree(sources / name, target)
        else:
            shutil.copy(sources / name, target)


def train_losses(run_dir: Path) -> list[tuple[int, float]]:
    return jsonl_scalars(run_dir)["train/loss"]


def theseus_logits(root: Path, run: str, ids: np.ndarray) -> np.ndarray:
    """The logits of run ``run``'s latest checkpoint, loaded with theseus's own run loading."""
    import jax.numpy as jnp

    from theseus.model.generation import load_run

    loaded = load_run(root, run)
    logits, _ = loaded.model.apply({"params": loaded.params}, jnp.asarray(ids), deterministic=True)
    return np.asarray(logits, dtype=np.float32)


# --- docs/evaluation.md --------------------------------------------------------------------------


@pytest.mark.slow
def test_evaluation_harness_flow(tmp_path: Path) -> None:
    pytest.importorskip("lm_eval")
    shell = Shell.create(tmp_path / "work", HF_DATASETS_CACHE=str(tmp_path / "datasets"))
    shell.run(flows("docs/evaluation.md")["harness"])
    run = shell.root / "runs" / "small"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (logged,) = [r for r in records if r["split"] == "eval"]
    assert logged["step"] == 20 and logged["harness/capitals/samples"] == 4 and "perplexity/loss" in logged
    results = json.loads((shell.cwd / "results.json").read_text())
    assert results["results"]["capitals"]["acc,none"] == pytest.approx(logged["harness/capitals/acc"])
    assert results["config"]["model_args"] == {"run": "small", "step": 20}
    table = shell.result("theseus run eval/harness").stdout
    assert "|capitals|" in table and "acc_norm" in table


# --- docs/fine-tuning.md -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fine_tuned(sources: Path, tmp_path_factory: pytest.TempPathFactory) -> Shell:
    """docs/fine-tuning.md's flows in page order in one working directory: GPT-2, then Llama."""
    shell = Shell.create(tmp_path_factory.mktemp("doc-flow-fine-tuning"))
    copy_into(shell, sources, "gpt2", "llama", "chat.jsonl")
    page = flows("docs/fine-tuning.md")
    shell.run(page["gpt2"])
    shell.run(page["llama"])
    return shell


@pytest.mark.slow
@pytest.mark.parametrize(
    ("base", "job", "run", "adapter", "merged"),
    [
        ("gpt2", "gpt/train/sft", "chat-gpt2", "adapter", "merged"),
        ("llama", "llama/train/sft", "chat-llama", "llama-adapter", "llama-merged"),
    ],
)
def test_fine_tuning_exports_match_peft_and_theseus(
    fine_tuned: Shell, base: str, job: str, run: str, adapter: str, merged: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(fine_tuned.cwd)  # the page's relative paths, as its reader uses them
    run_dir = fine_tuned.root / "runs" / run
    assert f"trained '{run}' to step 50/50" in fine_tuned.result(f"theseus run {job}").output
    config = (run_dir / "config.yaml").read_text()
    assert "rank: 8" in config and "n_layers: 2" in config and "n_embd: 32" in config  # from hf:./{base}

    # the fine-tuning learned: the last training loss is below the first
    losses = train_losses(run_dir)
    assert [step for step, _ in losses] == [1, 10, 20, 30, 40, 50]
    assert losses[-1][1] < losses[0][1] - 0.01, losses

    # ./adapter on ./base (the page's peft call), ./merged alone and the run itself: the same model
    assert sorted(p.name for p in Path(adapter).iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    ids = np.random.default_rng(1).integers(0, 280, (2, 16))
    with torch.no_grad():
        peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(f"./{base}"), f"./{adapter}").eval()
        adapted = hf_logits(peft, ids)
    plain, info = AutoModelForCausalLM.from_pretrained(f"./{merged}", output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ours = theseus_logits(fine_tuned.root, run, ids)
    base_logits = hf_logits(AutoModelForCausalLM.from_pretrained(f"./{base}").eval(), ids)
    assert adapted.shape == ours.shape == (2, 16, MODEL_VOCAB)
    assert np.max(np.abs(adapted - hf_logits(plain.eval(), ids))) <= 1e-4
    assert np.max(np.abs(adapted - ours)) <= 1e-4
    assert np.max(np.abs(adapted - base_logits)) > 1e-2  # the adapters changed the model: not a vacuous match


@pytest.mark.slow
def test_fine_tuning_chat_generation_and_data(fine_tuned: Shell) -> None:
    generated = fine_tuned.result("theseus run generate generate/run=chat-gpt2")
    assert generated.stdout.startswith(CHAT_PROMPT) and len(generated.stdout) > len(CHAT_PROMPT)
    assert f"chat prompt {CHAT_PROMPT!r}" in generated.stderr
    # each checkpoint's chat data, tokenized with its own tokenizer, masks included
    for name, base in [("chat", "gpt2"), ("chat-llama", "llama")]:
        data = fine_tuned.root / "data" / name
        assert (data / "tokenizer.json").read_bytes() == (fine_tuned.cwd / base / "tokenizer.json").read_bytes()
        assert (data / "train.mask").is_file()
    preparations = [r for r in fine_tuned.results if r.step.text.startswith("theseus run data/tokenize")]
    assert len(preparations) == 2
    for preparation, name in zip(preparations, ["chat", "chat-llama"], strict=True):
        assert re.search(rf"prepared {name}: train [\d,]+ tokens .*, val [\d,]+ tokens", preparation.output)
    # the run keeps its own copy of the tokenizer: preparing the data again cannot break it
    recorded = json.loads((fine_tuned.root / "runs" / "chat-gpt2" / "provenance.json").read_text())["tokenizer"]
    copy = fine_tuned.root / "runs" / "chat-gpt2" / "tokenizer" / "tokenizer.json"
    assert (
        recorded["path"] == str(copy) and copy.read_bytes() == (fine_tuned.cwd / "gpt2" / "tokenizer.json").read_bytes()
    )


@pytest.mark.slow
def test_preference_tuning_flow(sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/fine-tuning.md's preference flow: DPO with LoRA from ``hf:./gpt2``, then both exports."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    shell = Shell.create(tmp_path)
    copy_into(shell, sources, "gpt2")
    write_jsonl(shell.cwd / "preferences.jsonl", preference_rows(64))
    shell.run(flows("docs/fine-tuning.md")["preference"])
    monkeypatch.chdir(shell.cwd)
    prepared = shell.result("theseus run data/tokenize").output
    assert re.search(
        r"prepared preference: train [\d,]+ tokens / 112 documents, val [\d,]+ tokens / 16 documents", prepared
    )
    run_dir = shell.root / "runs" / "dpo-gpt2"
    assert "trained 'dpo-gpt2' to step 30/30" in shell.result("theseus run gpt/train/dpo").output
    train = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    assert train[0]["loss"] == pytest.approx(np.log(2), abs=1e-6)  # the policy starts as its reference
    assert train[-1]["rewards/margins"] > train[0]["rewards/margins"] and train[-1]["loss"] < train[0]["loss"]

    ids = np.random.default_rng(5).integers(0, 280, (2, 16))
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained("./gpt2").eval()
        base_logits = hf_logits(base, ids)
        adapted = hf_logits(PeftModel.from_pretrained(base, "./dpo-adapter").eval(), ids)
    merged, info = AutoModelForCausalLM.from_pretrained("./dpo-merged", output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ours = theseus_logits(shell.root, "dpo-gpt2", ids)
    assert np.max(np.abs(adapted - ours)) <= 1e-4
    assert np.max(np.abs(hf_logits(merged.eval(), ids) - ours)) <= 1e-4
    assert np.max(np.abs(adapted - base_logits)) > 1e-3  # the tuning changed the model


# --- docs/huggingface.md -------------------------------------------------------------------------


@pytest.mark.slow
def test_huggingface_local_folder_flow(sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shell = Shell.create(tmp_path / "work")
    copy_into(shell, sources, "llama", rename={"llama": "my-llama"})
    shell.run(flows("docs/huggingface.md")["local-folder"])
    runs = shell.root / "runs"

    imported = runs / "llama"
    assert (imported / "checkpoints" / "0").is_dir() and (imported / "tokenizer" / "tokenizer.json").is_file()
    assert "imported llama (2 layers, 32 wide" in shell.result("theseus run hf/import").output

    generated = shell.result("theseus run generate")
    assert generated.stdout.startswith("The meaning of life") and len(generated.stdout.strip()) > 20
    assert "greedy" in generated.stderr

    # the run starts from the imported weights, with the checkpoint's architecture
    assert "trained 'llama-finetuned' to step 20/20" in shell.result("theseus run llama/train/pretrain").output
    config = (runs / "llama-finetuned" / "config.yaml").read_text()
    assert all(f"{key}: 2" in config for key in ("n_layers", "n_kv_heads")) and "init_from: run:llama" in config
    losses = train_losses(runs / "llama-finetuned")
    assert [step for step, _ in losses] == [1, 10, 20]

    # ./export: bfloat16, one safetensors file (below 2GB), loads in transformers with every key
    monkeypatch.chdir(shell.cwd)
    export = Path("export")
    assert json.loads((export / "config.json").read_text())["dtype"] == "bfloat16"
    assert not (export / "model.safetensors.index.json").exists()
    with safe_open(export / "model.safetensors", framework="pt") as weights:
        assert {weights.get_tensor(key).dtype for key in weights.keys()} == {torch.bfloat16}  # noqa: SIM118
    model, info = AutoModelForCausalLM.from_pretrained("./export", output_loading_info=True, dtype=torch.float32)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    tokenizer = AutoTokenizer.from_pretrained("./export")
    assert (
        tokenizer("The meaning of life").input_ids
        == AutoTokenizer.from_pretrained("./my-llama")("The meaning of life").input_ids
    )
    ids = np.random.default_rng(2).integers(0, 280, (2, 12))
    ours = theseus_logits(shell.root, "llama-finetuned", ids)
    exported = hf_logits(model.eval(), ids)
    source = hf_logits(AutoModelForCausalLM.from_pretrained("./my-llama").eval(), ids)
    tolerance = 0.05 * np.max(np.abs(ours))  # bfloat16 weights: about 1.5 % measured
    assert np.max(np.abs(exported - ours)) <= tolerance
    assert np.max(np.abs(source - ours)) > tolerance  # the export holds the trained weights, not the source's


# --- docs/tracking.md ----------------------------------------------------------------------------


def row_of(listing: str, name: str) -> str:
    rows = [line for line in listing.splitlines() if line.split()[:1] == [name]]
    assert len(rows) == 1, listing
    return rows[0]


@pytest.mark.slow
def test_tracking_runs_flow(tmp_path: Path) -> None:
    shell = Shell.create(tmp_path / "work")
    shell.run(flows("docs/tracking.md")["runs"])
    baseline = shell.root / "runs" / "baseline"

    listing = shell.result("theseus runs").stdout
    assert listing.split()[:3] == ["NAME", "JOB", "STATUS"]
    assert re.search(r"gpt/train/pretrain\s+complete\s+20/20\s+\d", row_of(listing, "baseline"))
    assert re.search(r"gpt/train/pretrain\s+stopped at step 10\s+10/20\s+-", row_of(listing, "lr-6e-4"))

    # the sinks: TensorBoard's and W&B's records hold the metrics.jsonl values
    jsonl = jsonl_scalars(baseline)
    assert [step for step, _ in jsonl["train/loss"]] == [1, 10, 20]
    board = tensorboard_scalars(baseline)
    assert [step for step, _ in board["train/loss"]] == [1, 10, 20]
    assert [v for _, v in board["train/loss"]] == pytest.approx([v for _, v in jsonl["train/loss"]], rel=1e-6)
    (offline,) = baseline.glob("wandb/offline-run-*/run-*.wandb")
    wandb_run = wandb_offline_run(offline)
    assert wandb_run["id"] == json.loads((baseline / "wandb.json").read_text())["id"]
    assert wandb_run["history"][20]["train/loss"] == pytest.approx(jsonl["train/loss"][-1][1], rel=1e-6)
    assert not list((shell.root / "runs" / "lr-6e-4").glob("events.out.tfevents.*"))

    shown = shell.result("theseus runs show baseline").stdout
    assert re.search(r"^status\s+complete$", shown, re.MULTILINE)
    assert re.search(rf"^\s+tensorboard\s+tensorboard --logdir {re.escape(str(baseline))}$", shown, re.MULTILINE)
    assert re.search(rf"^\s+wandb\s+run id {wandb_run['id']} ", shown, re.MULTILINE)
    assert re.search(r"^\s+step\s+20\s.*best$", shown, re.MULTILINE)

    compared = shell.result("theseus runs compare").stdout
    assert compared.split()[:4] == ["RUN", "POINTS", "LAST", "train/loss"]
    last = {name: float(row_of(compared, name).split()[2]) for name in ("baseline", "lr-6e-4")}
    assert last["baseline"] == pytest.approx(jsonl["train/loss"][-1][1], abs=0.01)
    assert last["lr-6e-4"] == pytest.approx(train_losses(shell.root / "runs" / "lr-6e-4")[-1][1], abs=0.01)
    assert re.search(r"^training/lr\s+0.0003\s+0.0006$", compared, re.MULTILINE)
    assert "wrote cmp.png" in compared
    assert (shell.cwd / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- docs/multi-host.md --------------------------------------------------------------------------


@pytest.mark.slow
def test_multi_host_two_processes_on_one_machine(tmp_path: Path) -> None:
    from tests.distributed.test_scale_out import free_port

    # the page's coordinator port is ${PORT:-12345}: a free one here, so parallel test runs never collide
    shell = Shell.create(tmp_path / "work", PORT=str(free_port()))
    (script,) = shell.run(flows("docs/multi-host.md")["two-processes"])
    run = shell.root / "runs" / "gpt-train-pretrain"
    # `wait` succeeds whatever its children did: the run directory says whether both processes trained
    assert "trained 'gpt-train-pretrain' to step 20/20" in script.stderr, script.output[-3000:]
    assert script.stderr.count("trained 'gpt-train-pretrain'") == 1  # process 0 reports, process 1 is quiet
    record = json.loads((run / "provenance.json").read_text())
    assert record["process_count"] == 2
    assert sorted(d["process_index"] for d in record["devices"]) == [0, 0, 1, 1]
    assert json.loads((run / "status.json").read_text())["state"] == "complete"
    assert (run / "checkpoints" / "20").is_dir()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 10, 20]  # written once, by process 0
    assert len({(r["step"], r["split"]) for r in records}) == len(records)


# --- docs/writing-a-plugin.md --------------------------------------------------------------------


@pytest.mark.slow
def test_new_plugin_flow(tmp_path: Path) -> None:
    site = tmp_path / "site"
    shell = Shell.create(tmp_path / "work", **PIP_INTO_FOLDER, PIP_TARGET=str(site), PYTHONPATH=str(site))
    shell.run(flows("docs/writing-a-plugin.md")["new-plugin"])

    made = shell.result("theseus new plugin").stdout
    assert made.startswith("created theseus-wordcount (8 files):")
    assert "next: pip install ./theseus-wordcount && theseus jobs" in made  # the page's own commands
    assert (site / "theseus_wordcount-0.1.0.dist-info").is_dir()
    with pytest.raises(metadata.PackageNotFoundError):  # the project's environment is untouched
        metadata.distribution("theseus-wordcount")

    jobs = shell.result("theseus jobs")
    assert ["wordcount/train", "theseus-wordcount", "0.1.0"] in jobs.lines() and not jobs.stderr
    plugins = shell.result("theseus plugins")
    row = [line for line in plugins.lines() if line[:1] == ["theseus-wordcount"]]
    assert row == [["theseus-wordcount", "0.1.0", ">=0.1,<0.2", "1", "1", "theseus_metrics_sinks", "ok"]]
    assert not plugins.stderr
    assert re.search(r"^=+ 2 passed in ", shell.result("cd theseus-wordcount && pytest").stdout, re.MULTILINE)


@pytest.mark.slow
def test_jobs_from_a_plain_file_flow(tmp_path: Path) -> None:
    shell = Shell.create(tmp_path / "work")
    (done,) = shell.run(flows("docs/writing-a-plugin.md")["load-file"])
    assert (shell.cwd / "my_jobs.py").read_text().startswith("from theseus.base.job import Job")
    assert done.stdout.splitlines()[-1:] == ["hello"]
