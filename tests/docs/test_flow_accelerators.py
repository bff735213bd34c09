"""docs/accelerators.md's plan flows, as written: an 8B Llama-shaped model planned for 8 x H100 without
a GPU, and GPT-2 large for one TPU v5e chip without a TPU. The memory model is checked against the
analytic count, and the layouts against each other."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.docs.doc_flows import Shell
from tests.docs.flow_common import flows
from tests.plan.conftest import compilers

#: Llama 3 8B: 32 layers (4096 wide, 8 of 32 heads for keys and values, SwiGLU 14336), vocabulary
#: 128256 in the embedding and an untied head, two RMSNorm scales per layer and a final one.
LLAMA3_8B = 2 * 128256 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096
#: GPT-2 large: 36 layers 1280 wide (4x MLP, biases, two LayerNorms each), 50,304 padded token rows (tied
#: head), 1024 positions, a final LayerNorm.
GPT2_LARGE = 50304 * 1280 + 1024 * 1280 + 36 * (12 * 1280 * 1280 + 13 * 1280) + 2 * 1280


def gigabytes(text: str, label: str) -> float:
    found = re.search(rf"^\s+{label}\s+([\d,.]+) GB", text, re.MULTILINE)
    assert found, text
    return float(found.group(1).replace(",", ""))


@pytest.mark.slow
def test_accelerators_plan_flow(tmp_path: Path) -> None:
    shell = Shell.create(tmp_path / "work", PYTHONPATH=str(compilers()))
    shell.run(flows("docs/accelerators.md")["plan"])

    fsdp, dp = shell.results  # the page's two commands, in order
    assert "mesh/layout=fsdp --max-batch" in fsdp.step.text and "mesh/layout=dp model/remat=full --json" in dp.step.text
    text = fsdp.stdout
    assert "Traceback" not in fsdp.stderr and "cudart" not in fsdp.stderr
    # model/remat=auto (the default) is planned as a run chooses it: no remat fits, and the plan says so
    assert "model/remat=auto: chose remat=none, micro_batch_size=8: peak " in fsdp.stderr, fsdp.stderr
    assert "8.030B parameters, bfloat16 activations, layout fsdp (mesh data 8 x model 1)" in text
    # per device: float32 parameters and AdamW's two moments, an eighth each under fsdp (analytic +-2%)
    assert gigabytes(text, "parameters") == pytest.approx(LLAMA3_8B * 4 / 8 / 1e9, rel=0.02)
    assert gigabytes(text, "optimizer state") == pytest.approx(LLAMA3_8B * 8 / 8 / 1e9, rel=0.02)
    assert re.search(r"total\s+[\d.]+ GB of 84.94 GB: fits", text), text
    assert re.search(r"compiled / model = 0\.9\d", text), text
    assert re.search(r"estimated step [\d,.]+ ms .* MFU \d+\.\d%", text), text
    found = re.search(r"largest batch that fits: (\d+) x 4096 tokens", text)
    assert found and int(found.group(1)) >= 8, text

    replicated = json.loads(dp.stdout)
    assert replicated["memory"]["fits"] is False
    assert replicated["memory"]["parameters"] == pytest.approx(LLAMA3_8B * 4, rel=0.02)
    # even with every layer recomputed: float32 parameters, gradients and AdamW's two moments, 16 bytes a parameter
    assert replicated["memory"]["total"] >= 0.98 * 16 * LLAMA3_8B
    assert "model/remat=auto" not in dp.stderr  # a named policy is planned as named, one compile


@pytest.mark.slow
def test_accelerators_one_chip_flow(tmp_path: Path) -> None:
    """One v5e chip: model/remat=auto (the default) is planned as a run chooses it. The compiler refuses the
    2 rows of 512 tokens without remat, naming what they need, and the plan is the step with remat=dots,
    which fits in the 16.91 GB a program may use there (one refused compile, which is cheap, and one that
    fits: each fitting compile of a model this size costs about a minute of CPU)."""
    shell = Shell.create(tmp_path / "work", PYTHONPATH=str(compilers()))
    (result,) = shell.run(flows("docs/accelerators.md")["one-chip"])
    assert "--target v5e:1 " in result.step.text and result.step.text.endswith("training/batch_size=2")
    chose = re.search(
        r"^model/remat=auto: chose remat=dots, micro_batch_size=2: peak ([\d.]+) GB of 16\.9 GB \(what a program "
        r"may use on one TPU v5 lite\); none at 2 rows needs ([\d.]+) GB$",
        result.stderr,
        re.MULTILINE,
    )
    assert chose and float(chose.group(1)) <= 16.91 < float(chose.group(2)), result.stderr
    text = result.stdout
    assert text.startswith("train/pretrain on 1 x TPU v5e (v5e:1x1): compiled in "), text
    # float32 parameters and AdamW's two moments (analytic +-2%): 9.3 GB of the chip before the step runs
    assert gigabytes(text, "parameters") == pytest.approx(GPT2_LARGE * 4 / 1e9, rel=0.02)
    assert gigabytes(text, "optimizer state") == pytest.approx(GPT2_LARGE * 8 / 1e9, rel=0.02)
    assert re.search(r"batch 2 x 512 tokens\n", text), text
    assert re.search(r"total\s+[\d.]+ GB of 16\.91 GB: fits", text), text
