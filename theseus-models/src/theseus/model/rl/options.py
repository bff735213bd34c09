"""The ``rl/*`` keys of the soft losses (sapo, vespo) and of the importance-sampling correction, with
TRL 1.16's defaults (a loss's own where it has one: ``PolicyLoss.DEFAULTS``), and the checks of their
combinations with ``rl/loss``."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.rl.importance import SAMPLING_CORRECTIONS


@dataclass
class PolicyLossOptions:
    """Hyper-parameters of ``rl/loss=sapo`` and ``vespo`` (TRL's ``sapo_temperature_*``, ``vespo_*``)
    and the correction for rollouts sampled by another policy (TRL's ``vllm_importance_sampling_*``)."""

    sapo_temperature_pos: float = field(
        "rl/sapo_temperature_pos", default=1.0, above=0.0, help="sapo: gate temperature where the advantage is > 0"
    )
    sapo_temperature_neg: float = field(
        "rl/sapo_temperature_neg", default=1.05, above=0.0, help="sapo: gate temperature where the advantage is <= 0"
    )
    vespo_k_pos: float = field(
        "rl/vespo_k_pos", default=2.0, min=0.0, help="vespo: power k of the weight w^k e^-lambda(w-1), advantage >= 0"
    )
    vespo_lambda_pos: float = field(
        "rl/vespo_lambda_pos", default=3.0, min=0.0, help="vespo: decay lambda of the weight, advantage >= 0"
    )
    vespo_k_neg: float = field("rl/vespo_k_neg", default=3.0, min=0.0, help="vespo: power k, advantage < 0")
    vespo_lambda_neg: float = field(
        "rl/vespo_lambda_neg", default=2.0, min=0.0, help="vespo: decay lambda, advantage < 0"
    )
    sampling_correction: bool = field(
        "rl/sampling_correction",
        default=True,
        help="weigh tokens by the trained/sampling policy probability ratio when rollouts carry the sampler's "
        "log-probabilities (rl/async_rollouts with rl/max_staleness > 0; otherwise the ratio is 1)",
    )
    sampling_correction_mode: str | None = field(
        "rl/sampling_correction_mode",
        default=None,
        choices=SAMPLING_CORRECTIONS,
        help="ratio per token or per sequence; out-of-bounds ratios clipped (truncate) or zeroed (mask) (null: "
        "the loss's default, sequence_mask; vespo: token_mask)",
    )
    sampling_correction_max: float | None = field(
        "rl/sampling_correction_max", default=3.0, above=0.0, help="upper bound of the correction's ratio (null: none)"
    )
    sampling_correction_min: float | None = field(
        "rl/sampling_correction_min", default=None, min=0.0, help="lower bound of the correction's ratio (null: none)"
    )

    def correction_mode(self, loss: str) -> str:
        """``rl/sampling_correction_mode`` as set, else ``loss``'s own default, else ``sequence_mask`` (TRL's)."""
        from theseus.model.rl.policy_losses import loss_default

        return self.sampling_correction_mode or loss_default(loss, "rl/sampling_correction_mode", "sequence_mask")

    def check_policy_loss(self, loss: str, epsilon_high: float) -> None:
        """One ConfigError line for an unknown ``rl/loss`` or a combination of keys that cannot train as meant
        (``epsilon_high``: the upper clip the loss trains with)."""
        from theseus.model.rl.policy_losses import as_options, loss_class, policy_loss_names

        try:
            chosen = loss_class(loss)
        except ConfigError:
            names = policy_loss_names()
            close = difflib.get_close_matches(loss, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"rl/loss={loss!r} is not accepted; use one of: {', '.join(names)}{hint}") from None
        low, high = self.sampling_correction_min, self.sampling_correction_max
        if low is not None and high is not None and low >= high:
            raise ConfigError(
                f"rl/sampling_correction_min={low} must be below rl/sampling_correction_max={high}; lower the "
                "minimum or raise the maximum"
            )
        mode = self.correction_mode(loss)
        if self.sampling_correction and mode.endswith("_truncate") and low is high is None:
            raise ConfigError(
                f"rl/sampling_correction_mode={mode} clips the ratio to bounds, but "
                "rl/sampling_correction_min and rl/sampling_correction_max are both null; set one"
            )
        if loss == "cispo" and epsilon_high < 1.0:
            raise ConfigError(
                f"rl/loss=cispo caps the importance ratio at rl/epsilon_high={epsilon_high}, below 1, which scales "
                "down every on-policy token; set rl/epsilon_high>=1 (MiniMax-M1 and ScaleRL use 5, its default)"
            )
        try:  # the loss's own checks, with the correction it takes once rollouts carry a sampler's log-probabilities
            chosen().check(as_options({**dict(self.policy_loss_options(loss)), "epsilon_high": epsilon_high}))
        except ValueError as exc:
            raise ConfigError(f"rl/loss={loss}: {exc}") from None

    def policy_loss_options(self, loss: str) -> tuple[tuple[str, Any], ...]:
        """The keyword arguments of ``theseus.model.rl.loss.policy_loss`` these keys set for ``loss`` (hashable)."""
        return (
            ("sapo_temperature_pos", self.sapo_temperature_pos),
            ("sapo_temperature_neg", self.sapo_temperature_neg),
            ("vespo_k_pos", self.vespo_k_pos),
            ("vespo_lambda_pos", self.vespo_lambda_pos),
            ("vespo_k_neg", self.vespo_k_neg),
            ("vespo_lambda_neg", self.vespo_lambda_neg),
            ("sampling_correction", self.correction_mode(loss) if self.sampling_correction else None),
            ("sampling_clip_min", self.sampling_correction_min),
            ("sampling_clip_max", self.sampling_correction_max),
        )
