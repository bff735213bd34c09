"""``BaseTrainerConfig``: the configuration keys every trainer has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from theseus.config import field

Layout = Literal["dp", "fsdp", "tp", "fsdp+tp", "ep", "fsdp+ep", "tp+ep", "fsdp+tp+ep"]


@dataclass
class BaseTrainerConfig:
    """Run length, batch geometry, optimisation, intervals, run directory and mesh.

    Extend it with your own ``field()`` keys and read them through ``self.args``.
    """

    steps: int = field("training/steps", default=1000, min=1, help="optimizer steps of the whole run")
    batch_size: int = field("training/batch_size", default=32, min=1, help="global rows (sequences) per optimizer step")
    micro_batch_size: int = field(
        "training/micro_batch_size",
        default=0,
        min=0,
        help="global rows per forward/backward pass; batch_size/micro_batch_size micro-batches are accumulated "
        "(0 = batch_size)",
    )
    memory_limit_gb: float = field(
        "training/memory_limit_gb",
        default=0.0,
        min=0.0,
        help="device memory in GB that model/remat=auto fits the step and the next batch into "
        "(0 = what the device reports; a CPU reports none, and auto then keeps remat none)",
    )
    optimizer_state_dtype: Literal["float32", "bfloat16"] = field(
        "optimizer/state_dtype",
        default="float32",
        help="dtype the optimizer state is stored in (bfloat16 halves AdamW's moments; the update runs in float32)",
    )
    optimizer_offload: bool = field(
        "optimizer/offload",
        default=False,
        help="keep the optimizer state in host memory, moved to the device for each update (frees its device memory)",
    )
    optimizer_offload_keep_gb: float = field(
        "optimizer/offload_keep_gb",
        default=-1.0,
        min=-1.0,
        help="with optimizer/offload: GB per device of the state kept on the device, which then never crosses "
        "the host link (-1 = what model/remat=auto's step leaves room for; nothing without auto)",
    )
    sequence_length: int = field(
        "training/sequence_length", default=0, min=0, help="tokens per row (0 = the model's architecture/block_size)"
    )
    lr: float = field("training/lr", default=3e-4, above=0.0, help="peak learning rate (the schedule scales it)")
    grad_clip: float = field(
        "training/grad_clip", default=1.0, min=0.0, help="clip gradients to this global norm (0 = off)"
    )
    seed: int = field("training/seed", default=0, help="seed of initialisation, dropout and data order")
    log_interval: int = field("training/log_interval", default=10, min=1, help="write training metrics every N steps")
    eval_interval: int = field(
        "training/eval_interval", default=250, min=0, help="validate every N steps and at the end (0 = only at the end)"
    )
    eval_batches: int = field(
        "training/eval_batches", default=8, min=0, help="batches per validation (0 = no validation)"
    )
    eval_at_start: bool = field(
        "training/eval_at_start", default=False, help="also validate before the first update (the baseline, step 0)"
    )
    evaluation_interval: int = field(
        "training/evaluation_interval",
        default=0,
        min=0,
        help="run the EVALUATION classes every N steps (0 = only at the end)",
    )
    analysis_interval: int = field(
        "training/analysis_interval",
        default=0,
        min=0,
        help="run the ANALYSIS classes every N steps (0 = only at the end)",
    )
    checkpoint_interval: int = field(
        "training/checkpoint_interval",
        default=500,
        min=0,
        help="checkpoint every N steps (0 = only the final checkpoint)",
    )
    keep_checkpoints: int = field(
        "training/keep_checkpoints",
        default=3,
        min=0,
        help="latest checkpoints kept, besides the best one (0 = keep all)",
    )
    async_checkpoints: bool = field(
        "training/async_checkpoints", default=True, help="write checkpoints in the background while training continues"
    )
    precision: str = field(
        "training/precision",
        default="auto",
        choices=("auto", "fp8"),
        help="projection matmuls of the train and validation steps: auto (the activation dtype) or fp8 "
        "(e4m3 forward, e5m2 gradients, scaled per tensor)",
    )
    skip_nonfinite: bool = field(
        "training/skip_nonfinite",
        default=False,
        help="skip updates whose loss or gradient is NaN/inf (counted in metrics) instead of stopping",
    )
    skip_nonfinite_limit: int = field(
        "training/skip_nonfinite_limit",
        default=10,
        min=1,
        help="with training/skip_nonfinite, stop once this many updates in a row were skipped",
    )
    resume_step: int = field(
        "training/resume_step",
        default=0,
        min=0,
        help="resume from this checkpoint, setting newer ones aside (applied once per value; 0 = the newest)",
    )
    stop_after: int = field(
        "training/stop_after",
        default=0,
        min=0,
        help="end this invocation with a checkpoint once this step is reached; run again to continue (0 = off)",
    )
    profile: str = field(
        "training/profile",
        default="",
        help="START:STOP: write a jax.profiler trace of updates START..STOP into the run's profile/ folder",
    )
    peak_flops: float = field(
        "training/peak_flops",
        default=0.0,
        min=0.0,
        help="peak FLOP/s per device for MFU (0 = the accelerator's published figure; measured on CPU)",
    )
    progress: bool = field("training/progress", default=True, help="show a live progress bar on a terminal")
    plots: bool = field(
        "training/plots",
        default=True,
        help="draw the loss and plotted metrics as PNG files in the run folder (loss.png, ...) after each validation "
        "and at the end; false: no plots (matplotlib is not loaded)",
    )
    compilation_cache: bool = field(
        "training/compilation_cache",
        default=True,
        help="keep compiled XLA programs under <root>/cache/jax so a restart skips most compilation",
    )
    init_from: str = field(
        "training/init_from",
        default="",
        path="spec",
        help="start from run:<name>[@step] or hf:<folder or hub id> (parameters only; empty: random init)",
    )
    run_name: str = field("run/name", default="", help="run directory under <root>/runs (default: from the job key)")
    layout: Layout = field(
        "mesh/layout",
        default="dp",
        help="dp (replicated), fsdp (params over data), tp (over model), ep (experts over expert), or a + of them",
    )
    mesh_data: int = field("mesh/data", default=-1, help="size of the data mesh axis (-1 = fill the devices)")
    mesh_model: int = field("mesh/model", default=1, help="size of the model mesh axis (-1 = fill the devices)")
    mesh_expert: int = field(
        "mesh/expert", default=1, help="size of the expert mesh axis: experts and batch rows split over it (ep)"
    )
    mesh_context: int = field(
        "mesh/context", default=1, min=1, help="devices each sequence is split over (context parallelism)"
    )
    context_attention: Literal["allgather", "ring"] = field(
        "mesh/context_attention",
        default="allgather",
        help="with mesh/context > 1: allgather (gather keys and values) or ring (pass them round, less memory)",
    )
    mesh_pipeline: int = field(
        "mesh/pipeline",
        default=1,
        min=1,
        help="stages the scanned layer stack is split into, each on its own devices (pipeline parallelism)",
    )
    pipeline_schedule: Literal["gpipe", "1f1b", "interleaved"] = field(
        "mesh/pipeline_schedule",
        default="gpipe",
        help=(
            "with mesh/pipeline > 1: gpipe; 1f1b (the head and loss on the last stage, each stage holding at most "
            "2 x stages micro-batch inputs); interleaved (virtual stages, a smaller bubble)"
        ),
    )
    pipeline_microbatches: int = field(
        "mesh/pipeline_microbatches",
        default=0,
        min=0,
        help="parts each micro batch is cut into to fill the pipeline (0 = mesh/pipeline); more: a smaller bubble",
    )
    pipeline_virtual: int = field(
        "mesh/pipeline_virtual",
        default=2,
        min=1,
        help="with the interleaved schedule: stages per device, the stack cut into mesh/pipeline x this pieces",
    )
