"""lm-evaluation-harness in process: any theseus run (or a model while it trains) as an lm-eval model.

- :class:`~theseus.model.harness.model.TheseusLM` implements lm-eval's ``LM`` interface
  (``loglikelihood``, ``loglikelihood_rolling``, ``generate_until``) over a model, its parameters
  and its tokenizer: batched, jitted forward passes and the KV-cache generation of
  :mod:`theseus.model.generation`, with requests tokenized the way lm-eval's Hugging Face model
  tokenizes them (:mod:`.encoding`).
- The ``eval/harness`` job (:mod:`.jobs`) evaluates a run's checkpoint on lm-eval tasks and writes
  lm-eval's results JSON; the ``harness`` evaluation (:mod:`.evaluation`) does the same during
  training and logs ``harness/<task>/<metric>``.

lm-eval is an optional dependency (``pip install 'theseus-models[eval]'``): importing this package
never imports it; :func:`require_lm_eval` does, with a one-line error when it is missing.
"""

from theseus.model.harness.dependency import HarnessUnavailable, require_lm_eval

__all__ = ["HarnessUnavailable", "require_lm_eval"]
