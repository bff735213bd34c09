"""Errors that reach users as one clear line instead of a traceback."""

from __future__ import annotations


class TheseusError(Exception):
    """A user-facing error: the message names the problem and how to fix it.

    The CLI prints ``error: <message>`` and exits with ``exit_code`` (2 by default);
    the full traceback is shown only with ``--verbose``.
    """

    exit_code = 2


class ConfigError(TheseusError):
    """Invalid configuration: unknown key, wrong type, missing value, bad YAML."""


class PluginError(TheseusError):
    """A plugin distribution is broken, blocked, or conflicts with another."""


class DataError(TheseusError):
    """Prepared data is missing, corrupt, or does not match the job."""


class CheckpointError(TheseusError):
    """A checkpoint is corrupt or does not match the configured model."""


class RewardError(TheseusError):
    """A reward raised (or gave no finite number) on a completion, and ``rl/reward_errors=stop``."""


class ResourceError(TheseusError):
    """The machine refused a job: a read-only or forbidden path, a full disk, not enough memory."""


class TrainingError(TheseusError):
    """A training run cannot continue (non-finite loss, bad mesh, ...)."""

    exit_code = 1


def error_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of an exception that is not one of ours (a plugin's, a
    library's): its type alone when it has no message."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
