"""Choosing lm-eval tasks by name and checking that theseus can run them, one line per mistake.

Names are lm-eval's: registered tasks, groups and tags (glob patterns too), tasks of the YAML files
under an include path (as ``lm_eval --include_path``), or paths of task YAML files. With an include
path, names found there are loaded without indexing lm-eval's built-in tasks (thousands of files,
about 15 seconds); any other name indexes them as lm-eval does. An unknown name is one error with
lm-eval's closest names; a task asking for what theseus lacks (another output type, images or
audio, generation settings other than greedy or temperature / top-k / top-p sampling) is one error
naming the task and the field.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from theseus.errors import ConfigError, TheseusError
from theseus.model.harness.settings import settings

SUPPORTED_OUTPUTS = ("loglikelihood", "loglikelihood_rolling", "generate_until", "multiple_choice")


def task_names(text: str) -> list[str]:
    """The comma-separated names of ``text``, in order, each once."""
    names: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if name and name not in names:
            names.append(name)
    return names


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class Selection:
    """The task manager and the task names of one evaluation (globs expanded)."""

    manager: Any
    names: list[str]
    include_path: str = ""
    #: Whether ``manager`` indexes only the include path (loading retries with the full index).
    narrow: bool = False
    loaded: dict[str, Any] | None = field(default=None, repr=False)

    def full_manager(self) -> Any:
        """lm-eval's task manager over its built-in tasks and the include path (built once)."""
        if self.narrow:
            self.manager = _manager(self.include_path, defaults=True)
            self.narrow = False
        return self.manager


def _manager(include_path: str, *, defaults: bool) -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path or None, include_defaults=defaults)


def _matches(manager: Any, name: str) -> list[str]:
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return [str(Path(name).absolute())]
    if name in manager.all_tasks:
        return [name]
    return list(manager.match_tasks([name]))


def unknown_task(manager: Any, name: str, key: str, include_path: str, include_key: str) -> ConfigError:
    """'unknown lm-eval task ...; did you mean ...?' with lm-eval's closest names."""
    close = difflib.get_close_matches(name, manager.all_tasks, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    where = (
        f"the tasks of {include_path} and lm-eval's own"
        if include_path
        else f"lm-eval's own tasks (set {include_key}=FOLDER for task YAML files of your own)"
    )
    return ConfigError(
        f"unknown lm-eval task {name!r} ({key}); {hint}searched {where}; list them with 'lm-eval ls tasks'"
    )


def choose(
    text: str, include_path: str = "", *, key: str = "eval/tasks", include_key: str = "eval/include_path"
) -> Selection:
    """The tasks ``text`` names; ConfigError for an empty list, a missing folder or an unknown name."""
    names = task_names(text)
    if not names:
        raise ConfigError(f"{key} is empty; name lm-eval tasks, e.g. {key}=hellaswag,arc_easy")
    if include_path and not Path(include_path).is_dir():
        raise ConfigError(f"{include_key}={include_path} is not a folder of task YAML files")
    selection = Selection(None, [], include_path)
    if include_path:
        narrow = _manager(include_path, defaults=False)
        if all(_matches(narrow, name) for name in names):
            selection.manager, selection.narrow = narrow, True
    if selection.manager is None:
        selection.manager = _manager(include_path, defaults=True)
    for name in names:
        found = _matches(selection.manager, name)
        if not found:
            raise unknown_task(selection.manager, name, key, include_path, include_key)
        selection.names += [task for task in found if task not in selection.names]
    _check_declared(selection.manager, selection.names)
    return selection


def _check_declared(manager: Any, names: list[str]) -> None:
    """Output types theseus cannot run, read from the task index before anything is loaded."""
    for name in names:
        entry = manager.task_index.get(name)
        declared = dict(getattr(entry, "cfg", None) or {}).get("output_type")
        if declared is not None and declared not in SUPPORTED_OUTPUTS:
            where = f" ({entry.yaml_path})" if getattr(entry, "yaml_path", None) else ""
            raise unsupported_output(name, declared, where)


def unsupported_output(name: str, output: Any, where: str = "") -> ConfigError:
    return ConfigError(
        f"lm-eval task {name!r}{where} has output_type {output!r}, which theseus cannot run; "
        f"it runs {', '.join(SUPPORTED_OUTPUTS)} tasks"
    )


def load(selection: Selection) -> dict[str, Any]:
    """lm-eval's loaded tasks (``TaskManager.load``), checked with :func:`check_supported`."""
    try:
        loaded = selection.manager.load(selection.names)
    except TheseusError:
        raise
    except Exception as exc:
        if not selection.narrow:
            raise ConfigError(f"cannot load lm-eval tasks {', '.join(selection.names)}: {_one_line(exc)}") from exc
        return load_full(selection)
    check_supported(loaded)
    selection.loaded = loaded
    return loaded


def load_full(selection: Selection) -> dict[str, Any]:
    selection.full_manager()
    return load(selection)


def check_supported(loaded: dict[str, Any]) -> None:
    """ConfigError naming the task and field when a loaded task needs what theseus lacks."""
    for name, task in loaded["tasks"].items():
        config = getattr(task, "config", None)
        output = getattr(config, "output_type", None) or getattr(task, "OUTPUT_TYPE", None)
        if output not in SUPPORTED_OUTPUTS:
            raise unsupported_output(name, output)
        if getattr(task, "MULTIMODAL", False):
            raise ConfigError(
                f"lm-eval task {name!r} reads images or audio (doc_to_image / doc_to_audio); theseus models read text"
            )
        if output == "generate_until":
            settings(getattr(config, "generation_kwargs", None), eos="", where=f"lm-eval task {name!r}")


def top_level(loaded: dict[str, Any]) -> list[Any]:
    """The loaded groups and tasks that no loaded group contains (what ``simple_evaluate`` is given)."""
    children = {child for members in (loaded.get("group_map") or {}).values() for child in members}
    groups = [group for name, group in (loaded.get("groups") or {}).items() if name not in children]
    grouped = {task.task_name for group in groups for task in group.get_all_tasks()}
    tasks = [task for name, task in loaded["tasks"].items() if name not in children and name not in grouped]
    return [*groups, *tasks]


__all__ = [
    "SUPPORTED_OUTPUTS",
    "Selection",
    "check_supported",
    "choose",
    "load",
    "task_names",
    "top_level",
    "unknown_task",
]
