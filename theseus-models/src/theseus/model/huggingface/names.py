"""Which Hugging Face tensor holds which theseus parameter, and how its layout differs.

The building blocks of a family's ``tensor_maps`` (``theseus.model.huggingface.family``). Each
:class:`TensorMap` ties one checkpoint tensor to one or more theseus parameters (GPT-2's
fused ``c_attn`` holds the query, key and value; :func:`fused` builds such a map from one map per
part) with the two layout conversions. theseus keeps
attention projections per head (``query`` ``[embed, heads, head_dim]``, ``out``
``[heads, head_dim, embed]``) and dense kernels as ``[in, out]``; transformers' ``nn.Linear``
stores ``[out, in]`` and GPT-2's ``Conv1D`` ``[in, out]``. Both use the same half-split RoPE
layout, so no query/key permutation is needed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from theseus.model.stack.architecture import Architecture


Path = tuple[str, ...]


@dataclass(frozen=True)
class TensorMap:
    """``hf`` (shape ``hf_shape``) <-> the theseus parameters at ``paths``; with ``index``, the tensor
    is slice ``index`` of the leading axis of each of those parameters (see :func:`stacked_slice`).
    ``copy``: the checkpoint holds the same parameter again under this name (DeepSeek-V3's
    multi-token-prediction layer repeats the embedding and the head); export writes it, import checks
    its shape where present and reads the parameter from its other tensor. ``pieces``: the checkpoint
    stores ``hf`` as these tensors, ``(name, rows)`` each, joined along the first axis (transformers'
    ``Concatenate`` conversion: OLMo Hybrid's three convolutions are its ``conv1d``); import joins them
    whatever rows each holds (``save_pretrained`` splits the join evenly), export writes ``rows`` each."""

    hf: str
    hf_shape: tuple[int, ...]
    paths: tuple[Path, ...]
    to_theseus: Callable[[np.ndarray], list[np.ndarray]]
    to_hf: Callable[[list[np.ndarray]], np.ndarray]
    index: int | None = None
    copy: bool = False
    pieces: tuple[tuple[str, int], ...] = ()

    @property
    def stored(self) -> tuple[str, ...]:
        """The names the checkpoint holds this tensor under: its pieces', else ``hf``."""
        return tuple(name for name, _ in self.pieces) or (self.hf,)


def stacked_slice(index: int, part: TensorMap) -> TensorMap:
    """``part`` as slice ``index`` of the leading axis of its theseus parameters: many checkpoint
    tensors <-> one stacked parameter (transformers stores a mixture's experts one tensor each,
    theseus stacks them ``[expert, ...]``). Import gathers the slices of a parameter in one host buffer
    and places it once the last slice is read; export takes each slice of the stacked parameter."""
    return dataclasses.replace(part, index=index)


def same(hf: str, path: Path, shape: tuple[int, ...]) -> TensorMap:
    return TensorMap(hf, shape, (path,), lambda w: [w], lambda a: a[0])


def transposed(hf: str, path: Path, out_features: int, in_features: int) -> TensorMap:
    """An ``nn.Linear`` weight ``[out, in]`` <-> a theseus kernel ``[in, out]``."""
    return TensorMap(hf, (out_features, in_features), (path,), lambda w: [w.T], lambda a: a[0].T)


def _pad_rows(w: np.ndarray, rows: int) -> np.ndarray:
    return w if w.shape[0] == rows else np.pad(w, ((0, rows - w.shape[0]), (0, 0)))


def vocab_embedding(hf: str, path: Path, arch: Architecture) -> TensorMap:
    """The token embedding ``[vocab, width]`` <-> theseus' table padded to ``padded_vocab_size`` rows
    (zeros; the padded ids never occur)."""
    v, vp = arch.vocab_size, arch.padded_vocab_size
    return TensorMap(hf, (v, arch.n_embd), (path,), lambda w: [_pad_rows(w, vp)], lambda a: a[0][:v])


def vocab_head(hf: str, path: Path, arch: Architecture) -> TensorMap:
    """An untied ``lm_head`` ``nn.Linear`` ``[vocab, width]`` <-> theseus' kernel ``[width, padded vocab]``
    (zero columns for the padded ids, whose logits the model masks)."""
    v, vp = arch.vocab_size, arch.padded_vocab_size
    return TensorMap(hf, (v, arch.n_embd), (path,), lambda w: [_pad_rows(w, vp).T], lambda a: a[0][:, :v].T)


def embedding_maps(arch: Architecture, name: str = "model.embed_tokens.weight") -> list[TensorMap]:
    """A decoder checkpoint's first tensor: the token embedding ``name``."""
    return [vocab_embedding(name, ("token_embedding", "embedding"), arch)]


def head_maps(arch: Architecture, final_norm: str = "model.norm.weight") -> list[TensorMap]:
    """A decoder checkpoint's last tensors: the final norm's scale and, untied, the head ``lm_head.weight``."""
    maps = [same(final_norm, ("final_norm", "scale"), (arch.n_embd,))]
    if not arch.tied_embeddings:
        maps.append(vocab_head("lm_head.weight", ("lm_head",), arch))
    return maps


def heads_in(hf: str, path: Path, width: int, heads: int, head_dim: int) -> TensorMap:
    """A query/key/value ``nn.Linear`` weight ``[heads*head_dim, width]`` <-> ``[width, heads, head_dim]``."""
    return TensorMap(
        hf,
        (heads * head_dim, width),
        (path,),
        lambda w: [w.T.reshape(width, heads, head_dim)],
        lambda a: a[0].reshape(width, heads * head_dim).T,
    )


def heads_bias(hf: str, path: Path, heads: int, head_dim: int) -> TensorMap:
    return TensorMap(
        hf, (heads * head_dim,), (path,), lambda b: [b.reshape(heads, head_dim)], lambda a: a[0].reshape(-1)
    )


def heads_out(hf: str, path: Path, width: int, heads: int, head_dim: int) -> TensorMap:
    """The attention output ``nn.Linear`` weight ``[width, heads*head_dim]`` <-> ``[heads, head_dim, width]``."""
    return TensorMap(
        hf,
        (width, heads * head_dim),
        (path,),
        lambda w: [w.T.reshape(heads, head_dim, width)],
        lambda a: a[0].reshape(heads * head_dim, width).T,
    )


def fused(hf: str, parts: Sequence[TensorMap], axis: int = 0) -> TensorMap:
    """One checkpoint tensor holding ``parts`` concatenated along ``axis`` <-> the theseus parameters of
    every part, in order (Phi-3's ``qkv_proj``: the query, key and value rows; ``gate_up_proj``: the
    gate rows, then the up rows). Each part describes its own slice as if it were a tensor of its own
    (``heads_in``, ``transposed``, ...); its name is not used."""
    shapes = [part.hf_shape for part in parts]
    rest = {shape[:axis] + shape[axis + 1 :] for shape in shapes}
    if len(rest) != 1:
        raise ValueError(f"{hf}: parts of shapes {shapes} do not concatenate along axis {axis}")
    sizes = [shape[axis] for shape in shapes]
    bounds = np.cumsum(sizes)[:-1].tolist()
    counts = [len(part.paths) for part in parts]
    hf_shape = (*shapes[0][:axis], sum(sizes), *shapes[0][axis + 1 :])

    def to_theseus(w: np.ndarray) -> list[np.ndarray]:
        pieces = np.split(w, bounds, axis=axis)
        return [leaf for part, piece in zip(parts, pieces, strict=True) for leaf in part.to_theseus(piece)]

    def to_hf(leaves: list[np.ndarray]) -> np.ndarray:
        starts = np.cumsum([0, *counts]).tolist()
        pieces = [part.to_hf(leaves[a:b]) for part, a, b in zip(parts, starts[:-1], starts[1:], strict=True)]
        return np.concatenate(pieces, axis=axis)

    return TensorMap(hf, hf_shape, tuple(path for part in parts for path in part.paths), to_theseus, to_hf)


#: Checkpoint tensors that are buffers, not weights (recomputed by theseus): safe to skip on import.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")
