"""Every imported family computes the same logits sharded ``fsdp+tp`` over 4 devices as on one
(a mixture's experts gathered from their per-expert tensors onto the expert shardings); the families saved
with more than two layers for the import tests are saved with two here, one of each kind of layer, and those
whose layers are all alike with one (``families_sharded_run.FEWER_LAYERS``). Two families are left to one
whose parameters and sharding rules they share: OLMo 3 (``olmo3``) to OLMo 2 (its windows and per-layer RoPE
bases are masks and constants, sharded as Gemma's windowed layers are) and GLM-5 (``glm_moe_dsa``) to
DeepSeek-V3.2 (its indexer's rotary pairs interleaved instead of halved)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, clean_env

FAMILIES = [
    "mistral",
    "qwen3",
    "olmo2",
    "gemma2",
    "gemma3_text",
    "phi3",
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
    "gpt_oss",
    "llama4_text",
    "qwen3_next",
    "minimax_m2",
    "smollm3",
    "glm4_moe",
    "deepseek_v32",
    "qwen3_5_text",
    "qwen3_5_moe",
    "gemma4_text",
    "lfm2",
]
MIXTURES = {"mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "llama4_text", "qwen3_next", "minimax_m2"}
MIXTURES |= {"deepseek_v32"}
MIXTURES |= {"qwen3_5_moe"}
MIXTURES |= {"glm4_moe"}
#: Latent attention with the query bottleneck: the query kernel reads the (replicated) rank, heads over model.
QUERY_BOTTLENECK = {"deepseek_v32"}
#: Qwen3-Next's zero-centred norms scale by 1 + weight, near 2 with conftest's weights (1 + N(0, 0.2)): the
#: tensor-parallel sums' float32 rounding grows to 8.6e-6 on logits near 7 over its two layers here (1.8e-5
#: over the 4 layers of the import tests; 6e-6 with the norms' scales near 1; its Gated DeltaNet layer alone
#: agrees to 7e-7). Qwen3.5's the same, 1.05e-5 (dense) and 1.1e-5 (every layer a mixture) measured.
TOLERANCE = {"qwen3_next": 2e-5, "qwen3_5_text": 2e-5, "qwen3_5_moe": 2e-5}


def test_families_sharded_over_four_devices_equal_one_device(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.huggingface.families_sharded_run", str(tmp_path), *FAMILIES],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=clean_env(),
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    assert [family for family, *_ in lines] == FAMILIES
    for family, query, experts, diff in lines:
        assert int(query) == (2 if family in QUERY_BOTTLENECK else 4), family  # embed over data x heads over model
        assert int(experts) == (4 if family in MIXTURES else 0), family  # embed over data x width over model
        assert float(diff) <= TOLERANCE.get(family, 1e-5), (family, diff)
