"""Distillation end to end on CPU: a one-layer student distilled from a briefly trained teacher, on
its own completions (``train/distill``) or on a dataset (``train/distill_offline``), comes
closer to the teacher on held-out text; the step's loss is ``generalized_jsd`` on the completions; a
Hugging Face export of the teacher is the same teacher; and teacher mistakes are one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from tests.conftest import TINY_GPT
from tests.models.conftest import forward
from tests.reliability.conftest import call_cli, error_line
from tests.training.conftest import write_byte_corpus

#: A tiny byte-level GPT and what every run here shares (the teacher is trained with the same shape).
COMMON = [
    *TINY_GPT,
    "architecture/vocab_size=257",
    "training/log_interval=1",
    "training/eval_batches=0",
    "training/progress=false",
    "training/peak_flops=1e12",
]
STUDENT = [*COMMON, "training/batch_size=8", "training/lr=1e-2", "distill/teacher=run:teacher"]
LETTERS = Path(__file__).with_name("letters_env.py")
#: Held-out text in the teacher's style (words of the corpus, sentences it never saw).
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "slept", "quietly", "all", "day"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root with prepared byte data ``corpus`` and the run ``teacher``: 30 steps of pretraining on it."""
    folder = tmp_path_factory.mktemp("distill-root")
    write_byte_corpus(folder, "corpus")
    args = ["run", "train/pretrain", "dataset=corpus", "evaluation=", *COMMON, "training/steps=30"]
    assert call_cli([*args, "training/lr=1e-2", "run/name=teacher", "--root", str(folder)]) == 0
    return folder


def held_out() -> np.ndarray:
    """Four rows of 32 bytes of sentences made of the corpus's words."""
    rng = np.random.default_rng(7)
    text = " ".join(rng.choice(WORDS, size=200)).encode()
    return np.frombuffer(text[: 4 * 32], np.uint8).astype(np.int32).reshape(4, 32)


def kl_to_teacher(teacher: Any, model: Any, params: Any) -> float:
    """KL(teacher || student) per position on the held-out rows."""
    from theseus.model.rl.loss import forward_kl

    x = held_out()
    expected, logits = forward(teacher.model, teacher.params, x), forward(model, params, x)
    return float(forward_kl(logits, expected))


@dataclass
class Distilled:
    trainer: Any
    before: float  # KL to the teacher at step 0
    after: float
    rows: list[dict[str, Any]]  # the logged training steps


def distil(root: Path, job: str, name: str, *overrides: str) -> Distilled:
    """Run ``job`` (``train/distill`` or ``train/distill_offline``) in this process; the student's
    KL to the teacher before and after."""
    from theseus.model.loading.run import load_run
    from theseus.model.rl.distill import OfflineDistillTrainer, OnPolicyDistillTrainer

    job_class = OnPolicyDistillTrainer if job == "train/distill" else OfflineDistillTrainer
    trainer = job_class.create(root, [*STUDENT, *overrides, f"run/name={name}"], name=job)
    before = jax.device_get(trainer.init_state().params)
    trainer.run()
    teacher = load_run(root, "teacher")
    lines = (root / "runs" / name / "metrics.jsonl").read_text().splitlines()
    rows = [row for row in map(json.loads, lines) if row["split"] == "train"]
    after = jax.device_get(trainer.state.params)
    return Distilled(
        trainer, kl_to_teacher(teacher, trainer.model, before), kl_to_teacher(teacher, trainer.model, after), rows
    )


@pytest.fixture(scope="module")
def on_policy(root: Path) -> Iterator[Distilled]:
    """12 updates of on-policy distillation on the letters environment's prompts, with a JSD that is
    neither KL (beta 0.3) and a temperature of 2."""
    import tests.rl.letters_env  # noqa: F401  (registers environment/letters in this process, as --load does)

    done = distil(
        root,
        "train/distill",
        "on-policy",
        "environment=letters",
        "training/steps=12",
        "rl/max_new_tokens=8",
        "distill/beta=0.3",
        "distill/temperature=2.0",
    )
    yield done
    done.trainer.close()


def test_on_policy_distillation_brings_the_student_to_the_teacher(on_policy: Distilled) -> None:
    assert on_policy.after < 0.25 * on_policy.before, (on_policy.before, on_policy.after)
    losses = [row["loss"] for row in on_policy.rows]
    assert len(losses) == 12 and np.mean(losses[-3:]) < 0.6 * np.mean(losses[:3]), losses
    for name in ("completion_length", "completion_length_max", "rollout_seconds", "rollout_tokens_per_s", "reward"):
        assert all(np.isfinite(row[name]) for row in on_policy.rows), name
    assert all(1 <= row["completion_length"] <= 9 for row in on_policy.rows)


def test_offline_distillation_brings_the_student_to_the_teacher(root: Path) -> None:
    done = distil(root, "train/distill_offline", "offline", "dataset=corpus", "training/steps=8")
    done.trainer.close()
    assert done.after < 0.2 * done.before, (done.before, done.after)
    assert len(done.rows) == 8


def test_the_step_takes_generalized_jsd_at_the_completion_tokens(on_policy: Distilled) -> None:
    """The trainer's divergence of a batch of rollouts (its jitted validation step) is ``generalized_jsd``
    of the two models' logits with the completion mask, ``distill/beta`` and ``distill/temperature``."""
    from theseus.model.rl.loss import generalized_jsd

    trainer = on_policy.trainer
    rows = trainer.rollouts(3)
    teacher = trainer.teacher_params()
    meta = trainer.val_step_fn()(trainer.state, trainer.sharding.put_global(rows))[2]  # the pair is the CE
    total, count = meta["objective_loss_sum"], meta["objective_weight"]
    student = forward(trainer.model, trainer.state.params, rows["x"], rows["padding_mask"])
    expected = forward(trainer.teacher.model, teacher, rows["x"], rows["padding_mask"])
    mask = rows["completion_mask"]
    jsd = generalized_jsd(student, expected, mask, beta=0.3, temperature=2.0)
    assert float(count) == mask.sum() and 0 < mask.sum() < mask.size
    assert float(total) / float(count) == pytest.approx(float(jsd), rel=1e-5)
    everywhere = generalized_jsd(student, expected, rows["padding_mask"], beta=0.3, temperature=2.0)
    assert float(everywhere) != pytest.approx(float(jsd), rel=1e-3)  # the prompt's positions are left out


def test_the_teachers_parameters_are_arguments_of_the_compiled_step(on_policy: Distilled) -> None:
    """The divergence holds the teacher's parameters as an array field that the jitted step takes with each
    call: other parameters change the result of the same compiled program (constants would not)."""
    import jax

    trainer = on_policy.trainer
    assert trainer.objective().arrays() == {"teacher_params": None}  # the trainer gives them to the step
    rows = trainer.sharding.put_global(trainer.rollouts(2))
    fn = trainer.val_step_fn()
    teacher = trainer.teacher_params()
    first = float(fn(trainer.state, rows)[2]["objective_loss_sum"])
    trainer._teacher_params = jax.tree.map(lambda leaf: leaf * 0.5, teacher)
    try:
        halved = float(fn(trainer.state, rows)[2]["objective_loss_sum"])
    finally:
        trainer._teacher_params = teacher
    assert halved != first and fn.jitted._cache_size() == 1
    assert float(fn(trainer.state, rows)[2]["objective_loss_sum"]) == first


def test_a_hugging_face_export_of_the_teacher_is_the_same_teacher(root: Path, on_policy: Distilled) -> None:
    from theseus.model.rl.teacher import open_teacher

    assert call_cli(["run", "hf/export", "hf/run=teacher", f"hf/out={root / 'teacher-hf'}", "--root", str(root)]) == 0
    sharding = on_policy.trainer.sharding
    x = held_out()
    logits = []
    for spec in ("run:teacher", f"hf:{root / 'teacher-hf'}"):
        teacher = open_teacher(spec, root)
        assert teacher.vocab_size == 257
        logits.append(forward(teacher.model, teacher.load(sharding), x))
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["distill/teacher="],
            "error: distill/teacher is empty; name the teacher: distill/teacher=run:<name>[@step] (a theseus run) "
            "or hf:<folder> (a Hugging Face checkpoint)",
        ),
        (
            ["distill/teacher=teacher"],
            "error: distill/teacher='teacher' is not a teacher; use run:<name>[@step] (a theseus run) or "
            "hf:<folder> (a Hugging Face checkpoint)",
        ),
        (["distill/teacher=run:nope"], "error: distill/teacher=run:nope: no run 'nope' under {runs} (available: "),
        (
            ["architecture/vocab_size=300"],
            "error: distill/teacher=run:teacher predicts 257 ids but the student architecture/vocab_size=300; "
            "distillation needs one vocabulary: set architecture/vocab_size=257 (and the teacher's tokenizer)",
        ),
        (
            ["run/name=teacher"],
            "error: distill/teacher=run:teacher: that is the student's own run; name another run (the teacher) "
            "or set run/name",
        ),
        (
            ["distill/teacher=hf:./missing"],
            "error: distill/teacher=hf:{cwd}/missing: there is no folder {cwd}/missing; pass hf:<the folder a "
            "Hugging Face model was saved to>",
        ),
        (
            ["training/sequence_length=64", "architecture/block_size=64"],
            "error: distill/teacher=run:teacher reads at most 32 tokens (its architecture/block_size) but the "
            "student's rows hold 64; set training/sequence_length=32 or less",
        ),
        (["rl/loss=dapo"], "error: unknown configuration key 'rl/loss' (override)"),  # GRPO's, not distillation's
    ],
)
def test_teacher_mistakes_are_one_line(
    root: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], expected: str
) -> None:
    args = ["--load", str(LETTERS), "run", "train/distill", "environment=letters", *STUDENT]
    args += ["rl/max_new_tokens=8", "training/steps=1", *overrides]
    assert call_cli([*args, "--root", str(root)]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(expected.format(runs=root / "runs", cwd=Path.cwd())), line
    assert {p.name for p in (root / "runs").iterdir()} <= {"offline", "on-policy", "teacher"}
