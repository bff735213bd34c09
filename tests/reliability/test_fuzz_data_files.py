"""Generated malformed data files for the fine-tuning readers: chat conversations (``train/sft``),
preference pairs (``train/dpo``), instruction pairs and plain JSON lines, as ``data/tokenize`` reads and
encodes them. Rows lose fields, get values of every type, unknown roles, empty or deep collections, lone
surrogates, NaN; lines are cut, doubled or replaced by garbage, and bytes that are not UTF-8 appear.
Each file is read to the end and every document encoded, or refused in one line.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.reliability.fuzzing import ACCEPTED, ONE_LINE, attempt, fuzz_settings, hostile_value

ROLES = ("system", "user", "assistant", "tool")
#: What a reader is given: ``(dataset name, its configuration)``.
READERS = {
    "chat": {"data/chat/template": "chatml"},
    "chat-plain": {"data/chat/template": "plain"},
    "chat-gemma": {"data/chat/template": "gemma"},
    "preference": {"data/preference/template": "plain"},
    "instructions": {},
    "local": {"data/local/format": "jsonl"},
}
#: Lines a file may hold besides its rows.
BAD_LINES = ("{", "}", "[", "null", "[]", "{}", "1", '"text"', "NaN", "[" * 5000, "9" * 5000, "{'a': 1}", "\ufeff{}")


def message() -> st.SearchStrategy[Any]:
    """A message, mostly well formed."""
    good = st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": st.text(max_size=12)})
    odd = st.dictionaries(
        st.sampled_from(("role", "content", "name", "tool_calls")),
        st.one_of(st.sampled_from((*ROLES, "bot", "", "\ud800")), hostile_value()),
        max_size=3,
    )
    return st.one_of(good, good, odd, hostile_value())


def text_or_messages() -> st.SearchStrategy[Any]:
    return st.one_of(st.text(max_size=12), st.just("\udfff lone"), st.lists(message(), max_size=3), hostile_value())


def row(reader: str) -> st.SearchStrategy[Any]:
    """A row for ``reader``: its fields, each possibly missing or of another type, and a ``split``."""
    if reader.startswith("chat"):
        fields: dict[str, st.SearchStrategy[Any]] = {"messages": st.lists(message(), max_size=4)}
    elif reader == "preference":
        fields = {name: text_or_messages() for name in ("prompt", "chosen", "rejected")}
    elif reader == "instructions":
        fields = {"prompt": st.text(max_size=12), "response": st.text(max_size=12)}
    else:
        fields = {"text": st.text(max_size=12)}
    fields["split"] = st.sampled_from(("train", "val", "test", None))
    whole = st.fixed_dictionaries({}, optional=fields)
    return st.one_of(whole, whole, whole, hostile_value())


def line_of(value: Any, raw_unicode: bool) -> str:
    return json.dumps(value, ensure_ascii=not raw_unicode, allow_nan=True)


@st.composite
def data_file(draw: st.DrawFn, reader: str) -> bytes:
    """A JSONL file: rows, with some lines cut, doubled or replaced, and maybe bytes that are not UTF-8."""
    lines = [line_of(value, draw(st.booleans())) for value in draw(st.lists(row(reader), min_size=1, max_size=4))]
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(lines) - 1))
        change = draw(st.sampled_from(("cut", "double", "bad", "blank")))
        if change == "cut":
            lines[at] = lines[at][: draw(st.integers(0, len(lines[at])))]
        elif change == "double":
            lines.insert(at, lines[at])
        elif change == "bad":
            lines[at] = draw(st.sampled_from(BAD_LINES))
        else:
            lines.insert(at, draw(st.sampled_from(("", " ", "\t"))))
    data = "\n".join(lines).encode("utf-8", errors="surrogatepass")
    junk = draw(st.one_of(st.none(), st.sampled_from((b"\xff", b"\xc3", b"\x80abc", b"\xed\xa0\x80", b"\r\n"))))
    if junk is not None:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + junk + data[at:]
    return data


def read_and_encode(reader: str, path: Path) -> Iterator[int]:
    """Read every document of ``path`` as ``data/tokenize`` does and encode it with the byte tokenizer."""
    from theseus.config import configuration, configure
    from theseus.data.datasets import Chat, Instructions, LocalText, Preference
    from theseus.data.prepare import encode_chunk
    from theseus.data.tokenizers.byte import ByteTokenizer

    cls = {"preference": Preference, "instructions": Instructions, "local": LocalText}.get(reader, Chat)
    name = reader.split("-")[0]
    values = {f"data/{name}/path": str(path), "data/val_fraction": 0.0, "data/tokenizer": "byte", **READERS[reader]}
    with configuration(values):
        dataset = configure(cls)
    tokenizer = ByteTokenizer()
    for doc in dataset.documents():
        encoded = encode_chunk(tokenizer, [(doc.split or "train", doc.prompt, doc.text, doc.segments)])
        yield sum(int(tokens.size) for tokens, *_ in encoded.values())


def test_malformed_data_files_are_read_or_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    tally: Counter[str] = Counter()
    seen: Counter[str] = Counter()

    @fuzz_settings(max_examples=400)
    @given(data=st.data(), reader=st.sampled_from(sorted(READERS)))
    def check(data: st.DataObject, reader: str) -> None:
        path.write_bytes(data.draw(data_file(reader)))
        seen[reader] += 1
        attempt(tally, list, read_and_encode(reader, path))

    check()
    assert sum(tally.values()) >= 400 and tally[ACCEPTED] and tally[ONE_LINE]
    assert all(seen[reader] >= 30 for reader in READERS), seen
