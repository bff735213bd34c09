"""Hugging Face folders written to do harm: sizes a ``config.json`` claims beyond its weights, JSON nested
100,000 levels deep, safetensors headers with impossible shapes and offsets, an index that points out of
the folder, and two commands racing for one run name or output folder. Each is one line naming the file
(and the field or tensor), in bounded time, before any plan or array is built.

The checkpoints are written by hand (numpy and theseus' own safetensors writer): no torch is needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from theseus.errors import CheckpointError, ConfigError, TheseusError

CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def llama_shapes(layers: int = 2) -> dict[str, tuple[int, ...]]:
    """The tensors of ``CONFIG``'s Llama, by name."""
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (300, 32),
        "model.norm.weight": (32,),
        "lm_head.weight": (300, 32),
    }
    for i in range(layers):
        shapes.update(
            {
                f"model.layers.{i}.self_attn.q_proj.weight": (32, 32),
                f"model.layers.{i}.self_attn.k_proj.weight": (16, 32),
                f"model.layers.{i}.self_attn.v_proj.weight": (16, 32),
                f"model.layers.{i}.self_attn.o_proj.weight": (32, 32),
                f"model.layers.{i}.mlp.gate_proj.weight": (48, 32),
                f"model.layers.{i}.mlp.up_proj.weight": (48, 32),
                f"model.layers.{i}.mlp.down_proj.weight": (32, 48),
                f"model.layers.{i}.input_layernorm.weight": (32,),
                f"model.layers.{i}.post_attention_layernorm.weight": (32,),
            }
        )
    return shapes


def write_llama(folder: Path, shard_bytes: int = 1 << 30, **config: Any) -> Path:
    """A small Llama checkpoint in ``folder`` (``config`` over ``CONFIG``; shards past ``shard_bytes``)."""
    from theseus.model.huggingface.safetensors_io import PlannedTensor, write_checkpoint

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**CONFIG, **config}))
    planned = [
        PlannedTensor(name, shape, "F32", lambda shape=shape: np.full(shape, 0.01, np.float32))
        for name, shape in llama_shapes().items()
    ]
    write_checkpoint(folder, planned, shard_bytes)
    return folder


def raw_safetensors(path: Path, header: str, data: bytes = b"\0" * 64) -> Path:
    """A safetensors file with the header text ``header`` as given (not checked by any writer)."""
    encoded = header.encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


class StillWorking(BaseException):
    """Raised in a block that outlived its time: a BaseException, so no ``except OSError`` or ``except
    Exception`` of the code under test takes it for a failure of its own."""


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail the test (instead of hanging the suite or filling memory) when the block outlives ``seconds``:
    the sizes checked take milliseconds; building what they claim took minutes and all the memory."""

    def expire(*_: Any) -> None:
        raise StillWorking(f"still working after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def one_line(exc: pytest.ExceptionInfo[TheseusError], *parts: str) -> str:
    message = str(exc.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, message
    return message


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama(tmp_path_factory.mktemp("hf") / "llama")


def test_the_hand_written_checkpoint_imports(pristine: Path) -> None:
    """The refusals below are of damage alone: the intact folder is planned and checked without error."""
    from theseus.model.huggingface.importer import prepare

    prepared = prepare(pristine)
    assert prepared.model.architecture.n_layers == 2 and len(prepared.maps) == len(llama_shapes())


# -- sizes config.json claims --------------------------------------------------------------------------
CLAIMS = {
    "layers": ("num_hidden_layers", 10**12),
    "vocabulary": ("vocab_size", 10**9),
    "width": ("hidden_size", 10**9),
    "heads": ("num_attention_heads", 10**9),
    "experts": ("num_local_experts", 10**9),
    "mlp": ("intermediate_size", 5000),
}


@pytest.mark.parametrize("case", list(CLAIMS))
def test_a_claimed_size_beyond_the_weights_is_one_line_before_any_plan(
    case: str, pristine: Path, tmp_path: Path
) -> None:
    from theseus.model.huggingface.convert import open_checkpoint

    field, value = CLAIMS[case]
    folder = write_llama(tmp_path / "ckpt", **{field: value})
    with within(60), pytest.raises(ConfigError) as exc:
        open_checkpoint(folder)
    one_line(exc, f"config.json field {field}={value} is more than the checkpoint's weights hold", "21 tensors")


def test_a_claimed_count_past_64_bits_names_the_file_and_field(tmp_path: Path) -> None:
    from theseus.model.huggingface.convert import open_checkpoint

    folder = write_llama(tmp_path / "ckpt")
    (folder / "config.json").write_text(json.dumps(CONFIG)[:-1] + ', "n_layer": ' + "1" + "0" * 30 + "}")
    with within(60), pytest.raises(ConfigError) as exc:
        open_checkpoint(folder)
    one_line(exc, f"{folder / 'config.json'} is not readable JSON", 'field "n_layer" holds an integer of 31 digits')


def test_a_nested_language_model_s_claims_are_checked_too(tmp_path: Path) -> None:
    from theseus.model.huggingface.config_checks import WeightSizes, check_claims

    with pytest.raises(ConfigError) as exc:
        check_claims({"text_config": {"num_hidden_layers": 10**6}}, WeightSizes(tensors=21, largest=300))
    one_line(exc, "config.json field text_config.num_hidden_layers=1000000 is more than")


def test_hf_import_of_a_claimed_trillion_layers_is_one_line(tmp_path: Path, theseus: Any) -> None:
    folder = write_llama(tmp_path / "ckpt", num_hidden_layers=10**12)
    with within(120):
        code, _, err = theseus("run", "hf/import", f"hf/source={folder}", "run/name=x")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: config.json field num_hidden_layers="), err
    assert not (theseus.root / "runs" / "x").exists()


# -- JSON nested 100,000 levels ------------------------------------------------------------------------
DEEP = "[" * 100_000 + "]" * 100_000


def test_deep_config_json_is_one_line(tmp_path: Path) -> None:
    from theseus.model.huggingface.convert import open_checkpoint

    folder = write_llama(tmp_path / "ckpt")
    (folder / "config.json").write_text(json.dumps(CONFIG)[:-1] + ', "rope_scaling": ' + DEEP + "}")
    with pytest.raises(ConfigError) as exc:
        open_checkpoint(folder)
    one_line(exc, f"{folder / 'config.json'} is not readable JSON (it nests deeper than 64 levels)")


def test_deep_tokenizer_config_is_one_line(tmp_path: Path) -> None:
    from theseus.data.chat import read_json_object
    from theseus.errors import DataError
    from theseus.model.huggingface.tokenizer_files import chat_template_record

    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": ' + DEEP + "}")
    with pytest.raises(ConfigError) as exc:
        chat_template_record(tmp_path)
    one_line(exc, "tokenizer_config.json is not readable JSON (it nests deeper than 64 levels); download it again")
    with pytest.raises(DataError) as data_exc:  # as the chat templates of train/sft and rl read it
        read_json_object(tmp_path / "tokenizer_config.json")
    one_line(data_exc, "tokenizer_config.json is not readable JSON (it nests deeper")


def test_deep_safetensors_header_is_one_line(tmp_path: Path) -> None:
    from theseus.model.huggingface.safetensors_io import read_header

    path = raw_safetensors(tmp_path / "model.safetensors", '{"w": ' + DEEP + "}")
    with pytest.raises(CheckpointError) as exc:
        read_header(path)
    one_line(exc, f"{path} is not a valid safetensors file (its header: it nests deeper than 3 levels)")


# -- safetensors headers -------------------------------------------------------------------------------
def entry(shape: str, offsets: str, dtype: str = '"F32"') -> str:
    return f'{{"dtype": {dtype}, "shape": {shape}, "data_offsets": {offsets}}}'


HEADERS = {
    "shape-1e999": ('{"w": ' + entry("[1e999]", "[0, 4]") + "}", "tensor 'w' has shape [inf], not a list of counts"),
    "shape-10**30": (
        '{"w": ' + entry("[" + str(10**30) + ", 0]", "[0, 0]") + "}",
        f"tensor 'w' has shape ({10**30}, 0), with a dimension larger than the whole file",
    ),
    "shape-negative": ('{"w": ' + entry("[-1]", "[0, 4]") + "}", "tensor 'w' has shape [-1], not a list of counts"),
    "offsets-text": (
        '{"w": ' + entry("[1]", '["0", "4"]') + "}",
        "tensor 'w' has data_offsets ['0', '4'], not [begin, end] byte offsets",
    ),
    "offsets-null": ('{"w": ' + entry("[1]", "null") + "}", "tensor 'w' has data_offsets None, not [begin, end]"),
    "offsets-negative": ('{"w": ' + entry("[1]", "[-4, 0]") + "}", "tensor 'w' has data_offsets [-4, 0], not"),
    "offsets-backwards": ('{"w": ' + entry("[0]", "[8, 4]") + "}", "tensor 'w' of shape (0,) does not fit its byte"),
    "out-of-file": (
        '{"w": ' + entry("[32]", "[0, 128]") + "}",
        "tensor 'w' of shape (32,) does not fit its byte range",
    ),
    "size-mismatch": ('{"w": ' + entry("[2, 2]", "[0, 8]") + "}", "tensor 'w' of shape (2, 2) does not fit its byte"),
    "dtype": ('{"w": ' + entry("[1]", "[0, 4]", '"F4"') + "}", "tensor 'w' has dtype 'F4', which theseus does not"),
    "no-dtype": ('{"w": {"shape": [1], "data_offsets": [0, 4]}}', "tensor 'w' has no dtype, shape and data_offsets"),
    "overlap": (
        '{"a": ' + entry("[4]", "[0, 16]") + ', "b": ' + entry("[4]", "[8, 24]") + "}",
        "tensors 'a' and 'b' share data bytes 8..16",
    ),
    "inside": (
        '{"a": ' + entry("[8]", "[0, 32]") + ', "b": ' + entry("[2]", "[4, 12]") + "}",
        "tensors 'a' and 'b' share data bytes 4..12",
    ),
}


@pytest.mark.parametrize("case", list(HEADERS))
def test_a_damaged_header_is_one_line_naming_file_and_tensor(case: str, tmp_path: Path) -> None:
    from theseus.model.huggingface.safetensors_io import read_header

    header, message = HEADERS[case]
    path = raw_safetensors(tmp_path / "model.safetensors", header)
    with pytest.raises(CheckpointError) as exc:
        read_header(path)
    one_line(exc, f"{path} is not a valid safetensors file (", message, "download it again")


def test_adjacent_and_empty_tensors_are_accepted(tmp_path: Path) -> None:
    from theseus.model.huggingface.safetensors_io import read_header

    header = '{"a": ' + entry("[4]", "[0, 16]") + ', "b": ' + entry("[0, 5]", "[16, 16]") + ', "c": '
    path = raw_safetensors(tmp_path / "model.safetensors", header + entry("[4]", "[16, 32]") + "}")
    assert {name: info.shape for name, info in read_header(path).items()} == {"a": (4,), "b": (0, 5), "c": (4,)}


def test_a_tensor_in_two_files_is_refused(pristine: Path, tmp_path: Path) -> None:
    from theseus.model.huggingface.safetensors_io import read_index

    folder = write_llama(tmp_path / "ckpt")
    raw_safetensors(folder / "extra.safetensors", '{"model.norm.weight": ' + entry("[4]", "[0, 16]") + "}")
    (folder / "model.safetensors").rename(folder / "a.safetensors")
    with pytest.raises(CheckpointError) as exc:
        read_index(folder)
    one_line(exc, "tensor 'model.norm.weight' is in both", "a.safetensors", "extra.safetensors")


# -- the index and symbolic links ----------------------------------------------------------------------
@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    folder = write_llama(tmp_path / "sharded", shard_bytes=40_000)
    assert (folder / "model.safetensors.index.json").is_file()
    return folder


def shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("model-*.safetensors"))


def point_index(folder: Path, name: str) -> None:
    index = folder / "model.safetensors.index.json"
    record = json.loads(index.read_text())
    record["weight_map"]["lm_head.weight"] = name
    index.write_text(json.dumps(record))


@pytest.mark.parametrize("where", ["absolute", "parent", "subfolder", "number"])
def test_an_index_naming_files_outside_its_folder_is_refused(where: str, sharded: Path) -> None:
    from theseus.model.huggingface.safetensors_io import checkpoint_files

    outside = sharded.parent / "outside.safetensors"
    (sharded / "sub").mkdir()
    for path in (outside, sharded / "sub" / "x.safetensors"):
        path.write_bytes(shards(sharded)[0].read_bytes())
    name = {"absolute": str(outside), "parent": "../outside.safetensors", "subfolder": "sub/x.safetensors"}
    point_index(sharded, name.get(where, 7))  # type: ignore[arg-type]
    with pytest.raises(CheckpointError) as exc:
        checkpoint_files(sharded)
    shown = repr(name.get(where, "7"))
    one_line(exc, f"maps tensor 'lm_head.weight' to {shown}, which is not a file of its folder")


def test_a_weight_file_linking_out_of_the_folder_is_refused(sharded: Path) -> None:
    from theseus.model.huggingface.safetensors_io import checkpoint_files

    shard = shards(sharded)[-1]
    outside = sharded.parent / "elsewhere.safetensors"
    shard.rename(outside)
    shard.symlink_to(outside)
    with pytest.raises(CheckpointError) as exc:
        checkpoint_files(sharded)
    one_line(exc, f"{shard} leads outside {sharded} (to {outside})")


def test_links_inside_the_folder_and_into_a_hub_cache_s_blobs_are_read(pristine: Path, tmp_path: Path) -> None:
    from theseus.model.huggingface.safetensors_io import checkpoint_files

    repo = tmp_path / "models--org--name"
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    blob = repo / "blobs" / "5e1f"
    blob.write_bytes((pristine / "model.safetensors").read_bytes())
    (snapshot / "model.safetensors").symlink_to(os.path.relpath(blob, snapshot))
    assert checkpoint_files(snapshot) == [snapshot / "model.safetensors"]


def test_the_import_records_the_hash_of_each_shard_it_read(sharded: Path) -> None:
    from theseus.model.huggingface.convert import open_checkpoint
    from theseus.model.huggingface.importer import file_hashes

    hashes = file_hashes(open_checkpoint(sharded))
    names = [path.name for path in shards(sharded)]
    assert len(names) > 1 and set(hashes) == {"config.json", "model.safetensors.index.json", *names}


# -- two commands racing for one run name or output folder ----------------------------------------------
def test_publish_never_replaces_a_folder_with_contents(tmp_path: Path) -> None:
    from theseus.runs.lock import publish

    staging, final = tmp_path / ".staging", tmp_path / "final"
    staging.mkdir()
    (staging / "mine").write_text("mine")
    final.mkdir()
    (final / "theirs").write_text("theirs")
    assert publish(staging, final) is False
    assert (final / "theirs").read_text() == "theirs" and not (final / "mine").exists()
    assert (staging / "mine").is_file()
    (final / "theirs").unlink()  # an empty folder is replaced
    assert publish(staging, final) is True and (final / "mine").read_text() == "mine"


def test_the_loser_of_two_exports_to_one_folder_gets_one_line(tmp_path: Path) -> None:
    from theseus.model.huggingface.exporter import staged_folder

    out = tmp_path / "export"
    with pytest.raises(ConfigError) as exc, staged_folder(out) as staging:
        (staging / "config.json").write_text("{}")
        out.mkdir()  # the other export finished first
        (out / "config.json").write_text('{"winner": true}')
    one_line(exc, f"{out} was filled by another command while this export ran", "choose a new hf/out")
    assert json.loads((out / "config.json").read_text()) == {"winner": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # the loser's staging folder is gone


def test_the_loser_of_two_imports_of_one_name_gets_one_line(
    pristine: Path, theseus: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from theseus.model.huggingface import importer

    read_params = importer.read_params

    def winner_finishes_first(prepared: Any, *args: Any, **kwargs: Any) -> Any:
        winner = theseus.root / "runs" / "x"
        winner.mkdir()
        (winner / "config.yaml").write_text("winner: true\n")
        return read_params(prepared, *args, **kwargs)

    monkeypatch.setattr(importer, "read_params", winner_finishes_first)
    code, _, err = theseus("run", "hf/import", f"hf/source={pristine}", "run/name=x")
    assert code == 2 and err.count("\n") == 1, err
    assert "error: run 'x' was created in" in err and "by another command while this import ran" in err
    runs = theseus.root / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["x"]
    assert sorted(p.name for p in (runs / "x").iterdir()) == ["config.yaml"]
