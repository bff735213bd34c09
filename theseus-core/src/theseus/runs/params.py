"""Restoring a run's parameters from one of its checkpoints (the one reader, for every caller)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from theseus.errors import CheckpointError, TheseusError


def restore_params(path: Path, abstract: Any, shardings: Any = None, *, what: str, fix: str) -> Any:
    """Only ``params`` of the orbax state at ``path``, restored onto ``shardings`` (default: the first
    device), in either layer layout; nothing is written (a run may be saving meanwhile).

    ``what`` names the checkpoint in errors and ``fix`` says what to do, in one line each. A state whose
    files do not match their checksums is refused before anything is read."""
    import jax

    from theseus.checkpoint.integrity import damage
    from theseus.checkpoint.params import NoSavedParams, ParamsMismatch, read_params

    if shardings is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: device, abstract)
    problem = damage(path)
    if problem is not None:
        raise CheckpointError(
            f"{what} is damaged: {problem}; use an earlier checkpoint of that run, or resume the run, "
            "which sets damaged checkpoints aside"
        )
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    try:
        return read_params(path, target)
    except NoSavedParams as exc:
        raise CheckpointError(f"{what} holds no parameters; {fix}") from exc
    except ParamsMismatch as exc:
        raise CheckpointError(
            f"{what} holds {exc.found} for parameter {exc.key!r}, but the model expects {exc.shape}; {fix}"
        ) from exc
    except TheseusError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CheckpointError(f"cannot read the parameters of {what} ({path}): {type(exc).__name__}: {first}") from exc


__all__ = ["restore_params"]
