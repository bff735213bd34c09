"""``TheseusLM``: lm-eval's ``LM`` interface over a theseus model, its parameters and its tokenizer.

Import this module only after :func:`theseus.model.harness.dependency.require_lm_eval` succeeded:
it subclasses ``lm_eval.api.model.LM``.

The parameters are used where they are (one device, or a mesh given as ``sharding``): scoring is
one jitted forward pass per batch (:mod:`.scoring`), generation the jitted KV-cache loop of
:mod:`theseus.model.generation.decode`, both run by :mod:`.compute` (or, on several processes, by
:mod:`.lockstep`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
from lm_eval.api.model import LM

from theseus.data.tokenizers.base import Tokenizer
from theseus.model.harness.compute import Compute, Devices
from theseus.model.harness.encoding import Codec, Pair
from theseus.model.harness.generation import generate
from theseus.model.harness.scoring import ScoreFn, score_function, score_pairs
from theseus.model.harness.settings import Settings, settings
from theseus.model.loading.run import LoadedRun

if TYPE_CHECKING:
    from theseus.training.sharding import TrainerSharding


class TheseusLM(LM):
    """A theseus language model as an lm-eval model (``lm_eval.simple_evaluate(model=TheseusLM(...))``).

    ``max_length`` is the longest input the model sees (the model's block size by default),
    ``batch_size`` the rows of every forward pass, ``bos_id`` the id the tokenizer starts texts with
    (None: texts start after end-of-text), ``score`` a cached jitted scorer (built when None).
    ``sharding``: the mesh ``params`` live on (None: one device); ``compute`` replaces where the
    batches run (e.g. a :class:`~theseus.model.harness.lockstep.Lockstep` over several processes).
    """

    def __init__(
        self,
        model: Any,
        params: Any,
        tokenizer: Tokenizer,
        *,
        batch_size: int = 8,
        max_length: int | None = None,
        bos_id: int | None = None,
        score: ScoreFn | None = None,
        seed: int = 0,
        info: dict[str, Any] | None = None,
        sharding: TrainerSharding | None = None,
        compute: Compute | None = None,
    ) -> None:
        super().__init__()
        block = int(model.architecture.block_size)
        self.model = model
        self.params = params
        self.codec = Codec.create(tokenizer, bos_id)
        vocab = int(model.architecture.vocab_size)
        eot = int(tokenizer.eot_id)
        self.eot_id = eot if 0 <= eot < vocab else None
        self._max_length = min(int(max_length or block), block)
        self.batch_size = max(1, int(batch_size))
        score = score if score is not None else score_function(model)
        self.compute = compute if compute is not None else Devices(model, params, score, sharding)
        self.seed = seed
        self.info = dict(info or {})

    @classmethod
    def from_run(cls, run: LoadedRun, *, batch_size: int = 8, compute: Compute | None = None) -> TheseusLM:
        """The model of a loaded run (its checkpoint's parameters, tokenizer and block size)."""
        info = {"theseus_run": run.name, "theseus_step": run.step, "tokenizer": run.tokenizer.spec}
        return cls(
            run.model, run.params, run.tokenizer, batch_size=batch_size, bos_id=run.bos_id, compute=compute, info=info
        )

    # -- what lm-eval reads ------------------------------------------------------------------
    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def eot_token_id(self) -> int | None:
        return self.eot_id

    def get_model_info(self) -> dict[str, Any]:
        """Recorded in the results' ``config`` (parameters, dtype, run and step)."""
        leaves = jax.tree.leaves(self.params)
        dtypes = sorted({str(leaf.dtype) for leaf in leaves})
        return {
            "model_num_parameters": sum(int(leaf.size) for leaf in leaves),
            "model_dtype": ",".join(dtypes),
            "model_class": f"{type(self.model).__module__}:{type(self.model).__qualname__}",
            "max_length": self.max_length,
            **self.info,
        }

    # -- the three request types -----------------------------------------------------------------
    def _score(self, pairs: Sequence[Pair]) -> list[tuple[float, bool]]:
        return score_pairs(self.compute, pairs, batch_size=self.batch_size, max_length=self.max_length)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``(log-probability, greedy)`` of each request's continuation after its context."""
        args = [tuple(request.args) for request in requests]
        results = self._score([self.codec.pair(context, continuation) for context, continuation in args])
        for key, answer in zip(args, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", key, answer)
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """The log-probability of each whole text, scored in disjoint windows of the model's context."""
        owners: list[int] = []
        windows: list[Pair] = []
        for index, request in enumerate(requests):
            for window in self.codec.rolling(request.args[0], self.max_length):
                owners.append(index)
                windows.append(window)
        totals = [0.0] * len(requests)
        for owner, (value, _) in zip(owners, self._score(windows), strict=True):
            totals[owner] += value
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (request.args[0],), total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each request's continuation, generated until a stop string (greedy unless it samples)."""
        eos = self.codec.decode([self.eot_id]) if self.eot_id is not None else ""
        groups: dict[Settings, list[int]] = {}
        for index, request in enumerate(requests):
            where = f"lm-eval task {request.task_name!r}" if getattr(request, "task_name", None) else "a request"
            chosen = settings(request.args[1], eos=eos, where=where)
            groups.setdefault(chosen, []).append(index)
        texts = [""] * len(requests)
        for chosen, members in groups.items():
            done = generate(
                self.compute,
                self.codec,
                [requests[i].args[0] for i in members],
                chosen,
                batch_size=self.batch_size,
                max_length=self.max_length,
                seed=self.seed,
                eot_id=self.eot_id,
            )
            for index, text in zip(members, done, strict=True):
                texts[index] = text
                self.cache_hook.add_partial("generate_until", requests[index].args, text)
        return texts


__all__ = ["TheseusLM"]
