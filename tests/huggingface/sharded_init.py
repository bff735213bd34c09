"""Run in a subprocess with two host devices: ``training/init_from=hf:`` under ``mesh/layout=fsdp``.

Prints ``<partition spec> <shards> <step-1 loss - transformers loss>``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tests.conftest import xla_flags

os.environ["XLA_FLAGS"] = xla_flags(devices=2)
os.environ["JAX_PLATFORMS"] = "cpu"

from tests.huggingface.conftest import ONE_LAYER, hf_logits, save_model
from tests.huggingface.test_init_from import QUICK, FixedLlama, cross_entropy, fixed_batch, train_losses

tmp = Path(tempfile.mkdtemp(dir=sys.argv[1]))
model = save_model(tmp / "hf", "llama", tokenizer=False, **ONE_LAYER)
trainer = FixedLlama.create(
    tmp / "root", {**QUICK, "training/init_from": f"hf:{tmp / 'hf'}", "mesh/layout": "fsdp"}, name="fsdp"
)
state = trainer.init_state()
query = state.params["blocks_0"]["attn"]["query"]
trainer.run()
batch = fixed_batch(2, 16, 0)
diff = abs(train_losses(tmp / "root" / "runs" / "fsdp")[1] - cross_entropy(hf_logits(model, batch["x"]), batch["y"]))
print(query.sharding.spec, len(query.addressable_shards), diff)
