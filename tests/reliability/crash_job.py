"""A job file for ``theseus --load``: the tiny model on prepared byte data; writes hashes of its final state."""

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax
import numpy as np

from tests.training.tiny import TinyLM
from theseus.registry import job
from theseus.training.base import BaseTrainer
from theseus.training.flywheel.strategy import Sampling

HASHES = "final_state.json"


def tree_hash(tree: object) -> str:
    """sha256 over every leaf's dtype, shape and bytes, in tree order."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        array = np.asarray(leaf)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


@job("test/reliability/crash")
class CrashJob(BaseTrainer):
    MODEL = TinyLM
    DATASET = [Sampling("corpus", 1.0, "pmd")]

    def run(self) -> None:
        super().run()
        if self.state is not None:
            record = {
                "step": int(self.state.step),
                "params": tree_hash(self.state.params),
                "opt_state": tree_hash(self.state.opt_state),
            }
            path = self.context.root / "runs" / self.run_name / HASHES
            path.write_text(json.dumps(record))
