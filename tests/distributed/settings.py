"""Settings of the scale-out jobs (importable without registering the jobs)."""

from __future__ import annotations

from typing import Any

#: A 1-layer GPT (4 heads, 32 wide, the byte vocabulary 257, padded to 384 rows so that it splits over
#: 2 or 4 devices) and 5 steps
#: of 8 rows in 2 micro-batches: gradient accumulation is on.
SETTINGS: dict[str, Any] = {
    "architecture/preset": "tiny",
    "architecture/n_layers": 1,
    "model/scan_layers": True,  # stacked layers in every layout (a resumed run unrolls them)
    "architecture/n_embd": 32,
    "architecture/vocab_size": 257,
    "architecture/block_size": 16,
    "training/steps": 5,
    "training/batch_size": 8,
    "training/micro_batch_size": 4,
    "training/lr": 1e-2,
    "training/log_interval": 1,
    "training/eval_interval": 0,
    "training/eval_batches": 0,
    "training/checkpoint_interval": 0,
    "training/async_checkpoints": False,
    "training/progress": False,
    "training/peak_flops": 1e12,
}


def overrides(**extra: Any) -> list[str]:
    """``SETTINGS`` plus ``extra`` (``a__b`` for ``a/b``) as CLI ``key=value`` arguments."""
    values = {**SETTINGS, **{k.replace("__", "/"): v for k, v in extra.items()}}
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in values.items()]


def setup_errors(job: Any, root: Any, settings: dict[str, Any], mistakes: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The one-line ConfigError each of ``mistakes`` (keys over ``settings``) gives when ``job`` is set up
    in ``root`` (nothing is compiled); ``"no error"`` where setup passes."""
    from theseus.errors import ConfigError

    messages = {}
    for name, extra in mistakes.items():
        try:
            job.create(root, {**settings, **extra, "run/name": f"mistake-{name}"}).setup()
        except ConfigError as exc:
            messages[name] = str(exc)
        else:
            messages[name] = "no error"
    return messages
