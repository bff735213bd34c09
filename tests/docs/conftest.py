"""The files the docs flows start from, built once per test process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.flow_common import write_sources


@pytest.fixture(scope="session")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``gpt2/``, ``llama/`` and ``chat.jsonl`` (see :func:`write_sources`)."""
    return write_sources(tmp_path_factory.mktemp("doc-flow-sources"))
