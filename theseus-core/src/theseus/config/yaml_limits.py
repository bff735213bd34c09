"""Bounds on the YAML files theseus reads (``--config`` files and a run's ``config.yaml``).

A configuration is a few kilobytes. A file larger than :data:`MAX_BYTES`, or one whose anchors and
aliases stand for more than :data:`MAX_VALUES` values once expanded (a "billion laughs" file: each
anchor repeats the previous one nine times, so a few lines stand for billions of values), is refused
before anything walks or copies its values. Counting the expanded values is linear in the file: each
node's count is computed once, however many aliases point at it.

PyYAML only: listing runs reads this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from theseus.errors import ConfigError

#: The largest YAML file read, in bytes.
MAX_BYTES = 4 << 20
#: The most values (scalars, lists and mappings, each alias counted as what it stands for) a file may hold.
MAX_VALUES = 100_000


def bounded_yaml_text(path: Path) -> str:
    """The text of the YAML file ``path`` once it is known to be within the bounds; a ConfigError naming
    the file otherwise. A file that is not valid YAML is returned as it is, for its loader to report;
    OSError and UnicodeDecodeError as reading it raises them."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ConfigError(
            f"config file {str(path)!r} is larger than {MAX_BYTES >> 20} MiB, more than any configuration holds; "
            "keep only configuration values in it"
        )
    text = data.decode("utf-8")
    values = expanded_values(text)
    if values is None:
        raise ConfigError(
            f"config file {str(path)!r} has an alias inside the anchor it names (a value that contains "
            "itself); remove the alias"
        )
    if values > MAX_VALUES:
        raise ConfigError(
            f"config file {str(path)!r} stands for more than {MAX_VALUES:,} values once its aliases are "
            "expanded (nested anchors and aliases); write the values out without anchors and aliases"
        )
    return text


def expanded_values(text: str) -> int | None:
    """How many values the YAML ``text`` holds with every alias expanded, counted up to just past
    :data:`MAX_VALUES`; 0 for text that does not parse, None for a value that contains itself."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        root = yaml.compose(text, Loader=loader)  # nodes only: an alias is the node of its anchor, shared
    except (yaml.YAMLError, RecursionError):
        return 0
    if root is None:
        return 0
    counts: dict[int, int] = {}
    open_nodes: set[int] = set()
    pending: list[Any] = [root]
    while pending:
        node = pending[-1]
        if id(node) in counts:
            pending.pop()
            continue
        children = _children(node)
        waiting = [child for child in children if id(child) not in counts]
        if not waiting:
            pending.pop()
            open_nodes.discard(id(node))
            counts[id(node)] = min(MAX_VALUES + 1, 1 + sum(counts[id(child)] for child in children))
            continue
        if id(node) in open_nodes or any(id(child) in open_nodes for child in waiting):
            return None  # an alias back to an anchor still being composed: the value contains itself
        open_nodes.add(id(node))
        pending.extend(waiting)
    return counts[id(root)]


def _children(node: Any) -> list[Any]:
    """The nodes directly inside ``node`` (keys and values of a mapping)."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


__all__ = ["MAX_BYTES", "MAX_VALUES", "bounded_yaml_text", "expanded_values"]
