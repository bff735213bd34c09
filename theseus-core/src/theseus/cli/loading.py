"""``--load``: import a user file or module so its ``@job`` classes register."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from theseus.errors import TheseusError


def load_user_code(target: str) -> ModuleType:
    """Import ``target``: a path to a ``.py`` file or a dotted module name."""
    path = Path(target)
    if target.endswith(".py") or path.exists():
        if not path.is_file():
            raise TheseusError(f"--load {target!r}: no such file; give a .py file or an importable module")
        name = f"theseus_user_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise TheseusError(f"--load {target!r}: cannot import this file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, str(path.resolve().parent))
        try:
            spec.loader.exec_module(module)
        except TheseusError:
            raise
        except Exception as exc:
            raise TheseusError(f"--load {target!r} failed: {type(exc).__name__}: {exc}") from exc
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        raise TheseusError(f"--load {target!r}: no file or module of that name ({exc})") from exc
    except Exception as exc:
        raise TheseusError(f"--load {target!r} failed: {type(exc).__name__}: {exc}") from exc
