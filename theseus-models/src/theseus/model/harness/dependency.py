"""The optional dependency: lm-evaluation-harness (``pip install 'theseus-models[eval]'``).

Nothing in this package imports ``lm_eval`` when it is imported itself; the job and the
evaluation call :func:`require_lm_eval` first and import the modules that need it afterwards.
"""

from __future__ import annotations

from types import ModuleType

from theseus.errors import ConfigError

EXTRA = "pip install 'theseus-models[eval]'"


class HarnessUnavailable(ConfigError):
    """lm-evaluation-harness is not installed (or cannot be imported)."""


def require_lm_eval(what: str = "eval/harness") -> ModuleType:
    """The ``lm_eval`` package; HarnessUnavailable naming the extra when it cannot be imported."""
    try:
        import lm_eval
    except ImportError as exc:
        raise HarnessUnavailable(f"{what} needs lm-evaluation-harness; {EXTRA}") from exc
    return lm_eval
