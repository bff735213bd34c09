# ruff: noqa: E501  (HLO text has long lines)
"""The compiled-program analysis behind ``theseus plan``: FLOPs, bytes and collectives of HLO text, and
the chip table (``theseus.base.chips``) it prices them with, which the trainer's MFU reads too."""

from __future__ import annotations

import pytest

from theseus.base.chips import CHIPS, chip_of, published_peak
from theseus.errors import ConfigError
from theseus.plan import hlo
from theseus.plan.estimate import estimate
from theseus.plan.targets import gpu_target_config, parse_target
from theseus.training.throughput import known_peak_flops

#: A scanned stack in miniature: a 12-trip loop whose body runs a matmul fusion, reads one layer of a
#: stacked weight, updates a stacked buffer in place and all-gathers; cuDNN attention in the entry.
PROGRAM = """HloModule jit_step, is_scheduled=true

%gemm (p0: bf16[64,128], p1: bf16[128,256]) -> bf16[64,256] {
  %p0 = bf16[64,128]{1,0} parameter(0)
  %p1 = bf16[128,256]{1,0} parameter(1)
  ROOT %dot.1 = bf16[64,256]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%layer (q0: bf16[12,128,256], q1: s32[]) -> bf16[1,128,256] {
  %q0 = bf16[12,128,256]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %c0 = s32[] constant(0)
  ROOT %ds = bf16[1,128,256]{2,1,0} dynamic-slice(%q0, %q1, %c0, %c0), dynamic_slice_sizes={1,128,256}
}

%store (r0: f32[12,64,256], r1: f32[1,64,256], r2: s32[]) -> f32[12,64,256] {
  %r0 = f32[12,64,256]{2,1,0} parameter(0)
  %b0 = f32[12,64,256]{2,1,0} bitcast(%r0)
  %r1 = f32[1,64,256]{2,1,0} parameter(1)
  %r2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %dus = f32[12,64,256]{2,1,0} dynamic-update-slice(%b0, %r1, %r2, %z, %z)
}

%body (t: (s32[], bf16[64,128], bf16[12,128,256], f32[12,64,256])) -> (s32[], bf16[64,128], bf16[12,128,256], f32[12,64,256]) {
  %t = (s32[], bf16[64,128]{1,0}, bf16[12,128,256]{2,1,0}, f32[12,64,256]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[64,128]{1,0} get-tuple-element(%t), index=1
  %w = bf16[12,128,256]{2,1,0} get-tuple-element(%t), index=2
  %acc = f32[12,64,256]{2,1,0} get-tuple-element(%t), index=3
  %one = bf16[1,128,256]{2,1,0} fusion(%w, %i), kind=kLoop, calls=%layer
  %wl = bf16[128,256]{1,0} bitcast(%one)
  %y = bf16[64,256]{1,0} fusion(%x, %wl), kind=kCustom, calls=%gemm
  %yf = f32[1,64,256]{2,1,0} convert(%y)
  %acc2 = f32[12,64,256]{2,1,0} fusion(%acc, %yf, %i), kind=kLoop, calls=%store
  %g = bf16[512,128]{1,0} all-gather(%x), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  %one_i = s32[] constant(1)
  %next = s32[] add(%i, %one_i)
  ROOT %out = (s32[], bf16[64,128]{1,0}, bf16[12,128,256]{2,1,0}, f32[12,64,256]{2,1,0}) tuple(%next, %x, %w, %acc2)
}

%cond (u: (s32[], bf16[64,128], bf16[12,128,256], f32[12,64,256])) -> pred[] {
  %u = (s32[], bf16[64,128]{1,0}, bf16[12,128,256]{2,1,0}, f32[12,64,256]{2,1,0}) parameter(0)
  %k = s32[] get-tuple-element(%u), index=0
  %n = s32[] constant(12)
  ROOT %lt = pred[] compare(%k, %n), direction=LT
}

ENTRY %main (a: bf16[64,128], w: bf16[12,128,256], acc: f32[12,64,256], q: bf16[2,256,4,64], k: bf16[2,256,4,64], v: bf16[2,256,4,64]) -> f32[12,64,256] {
  %a = bf16[64,128]{1,0} parameter(0)
  %w = bf16[12,128,256]{2,1,0} parameter(1)
  %acc = f32[12,64,256]{2,1,0} parameter(2)
  %q = bf16[2,256,4,64]{3,2,1,0} parameter(3)
  %k = bf16[2,256,4,64]{3,2,1,0} parameter(4)
  %v = bf16[2,256,4,64]{3,2,1,0} parameter(5)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[64,128]{1,0}, bf16[12,128,256]{2,1,0}, f32[12,64,256]{2,1,0}) tuple(%zero, %a, %w, %acc)
  %loop = (s32[], bf16[64,128]{1,0}, bf16[12,128,256]{2,1,0}, f32[12,64,256]{2,1,0}) while(%init), condition=%cond, body=%body
  %fmha = (bf16[2,256,4,64]{3,2,1,0}, u8[0]{0}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"cudnn_fmha_backend_config":{"mask_type":"CAUSAL"}}
  %rs = f32[2,64,256]{2,1,0} reduce-scatter(%acc), channel_id=2, replica_groups={{0,1,2,3,4,5},{6,7}}, dimensions={0}, to_apply=%cond
  %ar = f32[64,256]{1,0} all-reduce(%acc), channel_id=3, replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%cond
  ROOT %result = f32[12,64,256]{2,1,0} get-tuple-element(%loop), index=3
}
"""


def test_loop_bodies_count_once_per_trip_and_custom_calls_count() -> None:
    cost = hlo.analyse(PROGRAM, devices=8)
    matmul = 2 * 64 * 256 * 128
    attention = 2 * 2 * 2 * 4 * 256 * 256 * 64 * 0.5  # QK^T and PV, causal half
    assert cost.unknown_trip_counts == 0
    assert cost.flops == pytest.approx(12 * matmul + attention)
    assert cost.custom_calls == {"__cudnn$fmhaSoftmax": 1}


SPLASH = """
HloModule splash

ENTRY %main (m: s8[1,1,1], q: bf16[2,4,1024,64], k: bf16[2,2,1024,64], v: bf16[2,2,1024,64]) -> f32[2,4,1024,64] {
  %m = s8[1,1,1]{2,1,0} parameter(0)
  %q = bf16[2,4,1024,64]{3,2,1,0} parameter(1)
  %k = bf16[2,2,1024,64]{3,2,1,0} parameter(2)
  %v = bf16[2,2,1024,64]{3,2,1,0} parameter(3)
  %splash_mha_fwd_residuals.1 = (bf16[2,4,1024,64]{3,2,1,0}, f32[2,4,1024,128]{3,2,1,0}) custom-call(%m, %m, %q, %k, %v), custom_call_target="tpu_custom_call"
  %splash_mha_dq_no_residuals.1 = bf16[2,4,1024,64]{3,2,1,0} custom-call(%m, %m, %q, %k, %v), custom_call_target="tpu_custom_call"
  %splash_mha_dkv_no_residuals.1 = (bf16[2,2,1024,64]{3,2,1,0}, bf16[2,2,1024,64]{3,2,1,0}) custom-call(%m, %m, %q, %k, %v), custom_call_target="tpu_custom_call"
  %other = f32[8]{0} custom-call(%m), custom_call_target="tpu_custom_call"
  ROOT %out = f32[2,4,1024,64]{3,2,1,0} convert(%splash_mha_dq_no_residuals.1)
}
"""


def test_splash_attention_kernels_count_their_matmuls_in_bf16() -> None:
    """The forward (2 matmuls), query gradient (3) and key/value gradient (4) of a causal splash kernel
    over 2 rows of 4 query heads of 64, 1024 tokens; a TPU kernel of another kind counts nothing."""
    cost = hlo.analyse(SPLASH, devices=1)
    square = 2 * 2 * 4 * 1024 * 1024 * 64 * 0.5
    assert cost.flops == pytest.approx((2 + 3 + 4) * square)
    assert cost.flops_by_dtype() == {"bf16": pytest.approx((2 + 3 + 4) * square)}
    assert cost.custom_calls == {"tpu_custom_call": 4}


#: A mixture's three megablox kernels as libtpu names them: 2,048 token copies of width 256 through 8
#: experts' [256, 512] weights (``gmm``), the copies' gradient (``gmm`` of the transposed weights) and the
#: weights' gradient (``tgmm``); the group metadata and offsets come first, as the kernels take them.
MEGABLOX = """
HloModule megablox

ENTRY %main (o: s32[9], x: bf16[2048,256], w: bf16[8,256,512], g: bf16[2048,512]) -> bf16[8,256,512] {
  %o = s32[9]{0} parameter(0)
  %x = bf16[2048,256]{1,0} parameter(1)
  %w = bf16[8,256,512]{2,1,0} parameter(2)
  %g = bf16[2048,512]{1,0} parameter(3)
  %jvp_jit_gmm__.2 = bf16[2048,512]{1,0:T(8,128)(2,1)S(1)} custom-call(%o, %o, %x, %w), custom_call_target="tpu_custom_call", metadata={op_name="jit(loss)/jvp(jit(gmm))/pallas_call"}
  %transpose_jvp_jit_gmm___.2 = bf16[2048,256]{1,0:T(8,128)(2,1)S(1)} custom-call(%o, %o, %g, %w), custom_call_target="tpu_custom_call", metadata={op_name="jit(loss)/transpose(jvp(jit(gmm)))/pallas_call"}
  ROOT %transpose_jvp_jit_tgmm___.2 = bf16[8,256,512]{2,1,0:T(8,128)(2,1)} custom-call(%o, %o, %x, %g), custom_call_target="tpu_custom_call", metadata={op_name="jit(loss)/transpose(jvp(jit(tgmm)))/pallas_call"}
}
"""


def test_megablox_kernels_count_the_routed_work() -> None:
    """Each megablox product counts its rows through one expert's weights, not through every expert's:
    forward, the rows' gradient and the weights' gradient, 2 x 2048 x 256 x 512 each."""
    cost = hlo.analyse(MEGABLOX, devices=1)
    assert cost.flops == pytest.approx(3 * 2 * 2048 * 256 * 512)
    assert cost.flops_by_dtype() == {"bf16": pytest.approx(3 * 2 * 2048 * 256 * 512)}
    assert cost.custom_calls == {"tpu_custom_call": 3}


def test_sliced_and_in_place_operands_move_only_their_slices() -> None:
    cost = hlo.analyse(PROGRAM, devices=8)
    by_name = {kernel.name: kernel for kernel in cost.kernels}
    index = 4  # the loop counter each reads
    assert by_name["one"].bytes == 2 * (128 * 256 * 2) + index  # one layer read and written, not the stack of 12
    assert by_name["acc2"].bytes == 2 * (64 * 256 * 4) + index  # the update read and written into the buffer
    assert by_name["one"].count == 12


def test_collectives_are_counted_per_execution_with_their_groups() -> None:
    summary = hlo.analyse(PROGRAM, devices=8).collective_summary()
    gathered = 512 * 128 * 2
    assert summary["all-gather"]["count"] == 12
    assert summary["all-gather"]["moved_bytes"] == pytest.approx(12 * gathered * 7 / 8)
    stack = 12 * 64 * 256 * 4
    assert summary["reduce-scatter"]["moved_bytes"] == pytest.approx(stack * 5 / 6)  # the larger group: 6
    assert summary["all-reduce"]["moved_bytes"] == pytest.approx(2 * stack * 1 / 2)  # pairs


def test_replica_group_forms() -> None:
    assert hlo.replica_groups("replica_groups=[2,4]<=[8]", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert hlo.replica_groups("replica_groups=[4,2]<=[2,4]T(1,0)", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert hlo.replica_groups("replica_groups={{0,2},{1,3}}", 4) == [[0, 2], [1, 3]]
    assert hlo.replica_groups("channel_id=1", 4) == [[0, 1, 2, 3]]


def test_convolution_counts_only_positions_off_the_padding() -> None:
    # a batched matmul in TPU form: 12 heads as a padded spatial window, 64 -> 2 features
    text = """HloModule m

ENTRY %main (a: bf16[1024,12,768,1], b: bf16[12,768,64,1]) -> bf16[1024,12,64,1] {
  %a = bf16[1024,12,768,1]{3,2,1,0} parameter(0)
  %b = bf16[12,768,64,1]{3,2,1,0} parameter(1)
  ROOT %c = bf16[1024,12,64,1]{3,2,1,0} convolution(%a, %b), window={size=12x1 pad=11_11x0_0 rhs_reversal=1x0}, dim_labels=b0f1_0io1->b0f1
}
"""
    # out 1024 x 64 features; spatial pairs: 12 outputs x (positions of a size-12 window that land on
    # the 12 inputs with 11 padding each side) = 12 * 12 minus what falls on padding
    pairs = sum(max(0, min(12, 12 + 11 - o) - max(0, 11 - o)) for o in range(12))
    assert hlo.analyse(text, 1).flops == 2 * 1024 * 64 * 768 * pairs


def test_targets_parse_and_refuse_in_one_line() -> None:
    assert parse_target("h100x8").devices == 8
    multi = parse_target("h100x8x4")
    assert (multi.hosts, multi.per_host, multi.topology) == (4, 8, "4x1x8")
    tpu = parse_target("v5e:16x16")
    assert (tpu.devices, tpu.platform, tpu.hosts) == (256, "tpu", 32)
    # one chip (Colab, Kaggle): v5e:1 is v5e:1x1, a v5p chip 1x1x1
    for spec, topology in (("v5e:1", "1x1"), ("v5e:1x1", "1x1"), ("v6e:1", "1x1"), ("v5p:1", "1x1x1")):
        one = parse_target(spec)
        assert (one.devices, one.hosts, one.topology) == (1, 1, topology)
    assert parse_target("v5e:1").describe() == "1 x TPU v5e (v5e:1x1)"
    with pytest.raises(ConfigError, match=r"^--target 'v5e:4': name a TPU slice by its topology, for example v5e:2x4"):
        parse_target("v5e:4")
    for bad in ("h100x9", "h100", "v9z:2x2", "b300x8"):
        with pytest.raises(ConfigError) as error:
            parse_target(bad)
        assert "\n" not in str(error.value) and "--target" in str(error.value)
    assert "cuda_compute_capability { major: 9 minor: 0 }" in gpu_target_config(parse_target("h100x8").chip)


@pytest.mark.parametrize(
    ("device_kind", "kind", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "h100", 989e12),
        ("NVIDIA H100 PCIe", "h100-pcie", 756e12),
        ("NVIDIA H100 NVL", "h100-nvl", 835e12),
        ("NVIDIA H200", "h200", 989e12),
        ("NVIDIA H200 NVL", "h200-nvl", 835e12),
        ("NVIDIA GH200 480GB", "gh200", 989e12),
        ("NVIDIA A100-SXM4-40GB", "a100", 312e12),
        ("NVIDIA L40S", "l40s", 362e12),
        ("TPU v5 lite", "v5e", 197e12),
        ("TPU v5", "v5p", 459e12),
        ("TPU v6 lite", "v6e", 918e12),
        ("TPU v4", "v4", 275e12),
    ],
)
def test_device_kinds_as_jax_reports_them_find_their_chip_and_peak(device_kind: str, kind: str, peak: float) -> None:
    """One table: the plan's target, the trainer's MFU and the benchmarks read the same chip."""
    assert chip_of(device_kind) is CHIPS[kind]
    assert published_peak(device_kind) == peak
    device = type("Device", (), {"device_kind": device_kind, "platform": CHIPS[kind].platform})()
    assert known_peak_flops(device) == (peak, f"published bf16 peak of {CHIPS[kind].description}")
    assert known_peak_flops(device, configured=1e12) == (1e12, "configured")


def test_unknown_device_kinds_have_no_published_peak() -> None:
    # A word stands alone: an L40 is not an L4, an H20 not an H200, an H800 not an H100.
    for device_kind in ("cpu", "NVIDIA L40", "NVIDIA H20", "NVIDIA H800", "TPU v7", ""):
        assert chip_of(device_kind) is None and published_peak(device_kind) is None
    assert known_peak_flops(type("Device", (), {"device_kind": "cpu"})()) is None
    for spec, kind in (("h100x8", "h100"), ("h200x8", "h200"), ("v5e:2x4", "v5e"), ("v5p:2x2x2", "v5p")):
        assert parse_target(spec).chip is chip_of(CHIPS[kind].name)


def test_estimate_prices_collectives_by_the_links_they_cross() -> None:
    cost = hlo.ProgramCost(collectives=[hlo.Collective("all-gather", 10**9, 2, [[0, 8]], 1)])
    one_host = estimate(cost, parse_target("h100x8"), overlap=0.0)
    two_hosts = estimate(cost, parse_target("h100x8x2"), overlap=0.0)
    assert one_host.collective_seconds == pytest.approx(0.5e9 / 450e9)
    assert two_hosts.collective_seconds == pytest.approx(0.5e9 / 50e9)
