"""FineWeb: web text from ``HuggingFaceFW/fineweb``, streamed from the hub or read from local parquet files."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.config import field
from theseus.data.datasets.base import Dataset, Document
from theseus.data.datasets.hf import find_files, stream_rows


@dataclass
class FineWeb(Dataset):
    """FineWeb documents (the ``text`` column) through Hugging Face ``datasets``.

    By default the ``data/fineweb/subset`` (e.g. ``sample-10BT``) streams from the hub; with
    ``data/fineweb/path`` set to a parquet file or a folder of downloaded parquet files, those are
    read instead, through the same streaming code path. Cap the amount with ``data/max_documents``.
    """

    name: ClassVar[str] = "fineweb"
    repository: ClassVar[str] = "HuggingFaceFW/fineweb"
    text_column: ClassVar[str] = "text"

    subset: str = field("data/fineweb/subset", default="sample-10BT", help="hub configuration to stream")
    path: str = field(
        "data/fineweb/path", default="", path="file", help="local parquet file or folder (empty: stream from the hub)"
    )

    def rows(self) -> Iterator[dict[str, Any]]:
        """The raw rows (every FineWeb column), in stream order."""
        if self.path:
            files = find_files(self.path, (".parquet",), key="data/fineweb/path")
            return stream_rows("parquet", data_files=files, columns=(self.text_column,))
        hint = "; check the network, or download the parquet files and pass data/fineweb/path=DIR"
        return stream_rows(self.repository, config_name=self.subset, columns=(self.text_column,), hint=hint)

    def source(self) -> Iterator[Document]:
        for row in self.rows():
            text = row.get(self.text_column)
            if isinstance(text, str):
                yield Document(text)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["origin"] = self.path or f"hf://{self.repository}/{self.subset}"
        return info
