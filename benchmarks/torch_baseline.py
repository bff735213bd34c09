"""A nanoGPT-style PyTorch training loop: the reference tokens/s on this CPU.

Same architecture as theseus' GPT: learned position embeddings, pre-LayerNorm blocks, causal
multi-head attention, a GELU (tanh) MLP of 4x width, biases, a final LayerNorm and an output head
tied to the token embedding; AdamW; float32. torch is optional (install the CPU build with
``pip install torch==2.13.0``); without it the measurement is skipped.

Run ``python benchmarks/torch_baseline.py --preset tiny --batch 8 --seq 256``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Loop, Timing, add_workload_arguments, cpu_cores, interleaved, start_like_theseus_run

SKIPPED = "skipped (torch not installed)"


@dataclasses.dataclass(frozen=True)
class Dims:
    """The sizes that define a GPT-2 style model."""

    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int
    mlp_ratio: float = 4.0
    bias: bool = True

    @property
    def d_ff(self) -> int:
        return math.ceil(round(self.mlp_ratio * self.n_embd, 6))


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def build_model(dims: Dims) -> Any:
    """The PyTorch GPT (an ``nn.Module``) for ``dims``."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = nn.Linear(dims.n_embd, 3 * dims.n_embd, bias=dims.bias)
            self.c_proj = nn.Linear(dims.n_embd, dims.n_embd, bias=dims.bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, e = x.shape
            q, k, v = self.c_attn(x).split(e, dim=2)
            q, k, v = (z.view(b, t, dims.n_head, e // dims.n_head).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, e))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(dims.n_embd, bias=dims.bias)
            self.attn = SelfAttention()
            self.ln_2 = nn.LayerNorm(dims.n_embd, bias=dims.bias)
            self.mlp = nn.Sequential(
                nn.Linear(dims.n_embd, dims.d_ff, bias=dims.bias),
                nn.GELU(approximate="tanh"),
                nn.Linear(dims.d_ff, dims.n_embd, bias=dims.bias),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(dims.vocab_size, dims.n_embd)
            self.wpe = nn.Embedding(dims.block_size, dims.n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(dims.n_layer))
            self.ln_f = nn.LayerNorm(dims.n_embd, bias=dims.bias)
            self.lm_head = nn.Linear(dims.n_embd, dims.vocab_size, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            t = idx.shape[1]
            pos = torch.arange(t, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)

    return GPT()


class TorchLoop(Loop):
    """The PyTorch training loop as a timed :class:`~benchmarks.common.Loop` (needs torch)."""

    name = "pytorch (nanoGPT-style)"

    def __init__(
        self,
        dims: Dims,
        batches: list[tuple[Any, Any]],
        *,
        threads: int | None = None,
        compile: bool = False,
        lr: float = 3e-4,
        weight_decay: float = 0.1,
        flops_per_step: float | None = None,
    ) -> None:
        self.dims, self.batches = dims, batches
        self.threads = threads or cpu_cores()
        self.compile, self.lr, self.weight_decay = compile, lr, weight_decay
        batch, seq = batches[0][0].shape
        self.tokens_per_step = batch * seq
        self.flops_per_step = flops_per_step
        self.index = 0
        self.params = 0
        if compile:
            self.name += " compiled"

    def build(self) -> None:
        import numpy as np
        import torch

        torch.set_num_threads(self.threads)
        torch.manual_seed(0)
        self.model = build_model(self.dims)
        self.model.train()
        named = list(self.model.named_parameters())
        self.optimizer = torch.optim.AdamW(
            [
                {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": self.weight_decay},
                {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
            ],
            lr=self.lr,
            betas=(0.9, 0.95),
            eps=1e-8,
        )
        self.loss_fn = torch.compile(self.model) if self.compile else self.model
        self.data = [
            (torch.from_numpy(np.asarray(x, np.int64)), torch.from_numpy(np.asarray(y, np.int64)))
            for x, y in self.batches
        ]
        self.params = sum(p.numel() for p in self.model.parameters())

    def run(self, steps: int) -> None:
        import torch

        for _ in range(steps):
            x, y = self.data[self.index % len(self.data)]
            self.index += 1
            loss = self.loss_fn(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.last = loss.detach()

    def prepare(self, warmup: int) -> float:
        start = time.perf_counter()
        self.build()
        self.run(1)
        first = time.perf_counter() - start
        self.run(warmup)
        return first

    def close(self) -> None:
        self.model = self.optimizer = self.loss_fn = self.data = None  # type: ignore[assignment]


def measure_torch(
    dims: Dims,
    batches: list[tuple[Any, Any]],
    *,
    steps: int = 5,
    repeats: int = 3,
    warmup: int = 2,
    compile: bool = False,
) -> Timing | None:
    """Median seconds per AdamW training step (forward, backward, clip, update) of the PyTorch loop.

    ``batches`` are ``(x, y)`` int numpy arrays ``[B, T]`` cycled through; returns None without torch.
    """
    if not torch_available():
        return None
    loop = TorchLoop(dims, batches, compile=compile)
    try:
        return interleaved([loop], steps=steps, repeats=repeats, warmup=warmup)[loop.name]
    finally:
        loop.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_workload_arguments(parser)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (needs a C++ compiler)")
    args = parser.parse_args(argv)
    if not torch_available():
        print(f"torch baseline: {SKIPPED}")
        return
    from benchmarks.workload import Workload

    work = Workload.create(args.preset, batch=args.batch, seq=args.seq, build=False)
    timing = measure_torch(
        work.dims, work.torch_batches(), steps=args.steps, repeats=args.repeats, compile=args.compile
    )
    assert timing is not None
    print(f"{timing.name}: {timing.step_seconds * 1e3:.1f} ms/step, {timing.tokens_per_s:.0f} tokens/s")


if __name__ == "__main__":
    start_like_theseus_run()
    main()
