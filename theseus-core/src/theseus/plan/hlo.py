"""What a compiled program does per step, read from its optimised HLO text.

XLA's own cost analysis counts a loop's body once and skips custom calls (cuBLAS, cuDNN), so a
scanned layer stack or a fused attention kernel would vanish from it. Here every computation is
costed once and multiplied by how often it runs: a ``while`` by its known trip count, a fusion or
call by one. Per device, it gives:

- matmul FLOPs (``dot``, GEMM custom calls, cuDNN attention forward and backward, the splash attention
  and megablox grouped-matmul kernels of TPUs);
- the kernels' bytes read and written (a fusion reads its operands and writes its result once);
- each collective's count, bytes and group size, which the estimate prices by the links it crosses.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field

import numpy as np

BYTES_PER_ELEMENT = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8,
    "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16, "token": 0,
}  # fmt: skip
_FP8 = re.compile(r"^f8e\w+$")
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "ragged-all-to-all", "collective-permute")
#: Instructions that are bookkeeping, not kernels: they move no bytes of their own.
_FREE = {
    "parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while", "call", "conditional",
    "after-all", "partition-id", "replica-id", "opt-barrier", "iota", "async-done", "all-gather-done",
    "all-reduce-done", "collective-permute-done", "copy-done", "send-done", "recv-done", "add-dependency",
    "get-dimension-size", "domain",
}  # fmt: skip
_SHAPE = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")


@dataclass
class Instruction:
    name: str
    type: str
    opcode: str
    operands: list[str]
    attributes: str
    arguments: str = ""
    root: bool = False

    def called(self, key: str) -> list[str]:
        """Computations named by attribute ``key`` (``calls=``, ``body=``, ``branch_computations=``)."""
        found = re.search(rf"\b{key}=\{{?([^}},]+(?:,\s*%[\w.\-]+)*)\}}?", self.attributes)
        if not found:
            return []
        return [name.strip().lstrip("%") for name in found.group(1).split(",") if name.strip()]


@dataclass
class Collective:
    """One collective instruction as it runs per step: ``count`` executions of ``bytes`` each."""

    opcode: str
    bytes: int
    group_size: int
    groups: list[list[int]] = field(default_factory=list)
    count: int = 1

    @property
    def moved_bytes(self) -> float:
        """Bytes each device sends per execution (ring algorithms; an all-reduce is a reduce-scatter
        then an all-gather)."""
        n = self.group_size
        if n <= 1:
            return 0.0
        share = (n - 1) / n
        if self.opcode == "all-reduce":
            return 2.0 * self.bytes * share
        if self.opcode == "collective-permute":
            return float(self.bytes)
        return self.bytes * share


@dataclass
class Kernel:
    """A kernel-level instruction and how often it runs per step."""

    name: str
    opcode: str
    flops: float
    bytes: float
    count: int
    dtype: str


@dataclass
class ProgramCost:
    """Per-device totals of one compiled program."""

    flops: float = 0.0
    bytes_accessed: float = 0.0
    collectives: list[Collective] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    custom_calls: dict[str, int] = field(default_factory=dict)
    unknown_trip_counts: int = 0

    def flops_by_dtype(self) -> dict[str, float]:
        """Matmul FLOPs per step by the matmul's input type (``bf16``, ``f8e4m3fn``, ...), largest first."""
        totals: dict[str, float] = {}
        for kernel in self.kernels:
            if kernel.flops:
                totals[kernel.dtype] = totals.get(kernel.dtype, 0.0) + kernel.flops * kernel.count
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    def collective_summary(self) -> dict[str, dict[str, float]]:
        """Per collective kind: executions per step and bytes moved per device per step."""
        summary: dict[str, dict[str, float]] = {}
        for c in self.collectives:
            entry = summary.setdefault(c.opcode, {"count": 0, "bytes": 0.0, "moved_bytes": 0.0})
            entry["count"] += c.count
            entry["bytes"] += c.bytes * c.count
            entry["moved_bytes"] += c.moved_bytes * c.count
        return summary


def element_bytes(dtype: str) -> float:
    if _FP8.match(dtype):
        return 1
    return BYTES_PER_ELEMENT.get(dtype, 4)


def shapes(text: str) -> list[tuple[str, tuple[int, ...]]]:
    """Every array shape ``dtype[d0,d1]`` in a type string (a tuple type gives several)."""
    return [(dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in _SHAPE.findall(text)]


def type_bytes(text: str) -> float:
    return sum(element_bytes(dtype) * math.prod(dims) for dtype, dims in shapes(text))


def _balanced(text: str, start: int) -> int:
    """Index just past the parenthesis group opening at ``text[start]``."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] == "(":
            depth += 1
        elif text[index] == ")":
            depth -= 1
            if depth == 0:
                return index + 1
    return len(text)


def parse_instruction(line: str) -> Instruction | None:
    match = _INSTRUCTION.match(line)
    if not match:
        return None
    name, rest = match.group(1), match.group(2)
    if rest.startswith("("):
        end = _balanced(rest, 0)
    else:
        end = rest.find(" ")
        if end < 0:
            return None
    type_text, rest = rest[:end], rest[end:].lstrip()
    opened = rest.find("(")
    if opened <= 0:
        return None
    opcode = rest[:opened].strip()
    closed = _balanced(rest, opened)
    operands = re.findall(r"%([\w.\-]+)", rest[opened:closed])
    root = line.lstrip().startswith("ROOT ")
    return Instruction(name, type_text, opcode, operands, rest[closed:], rest[opened + 1 : closed - 1], root)


def parse_module(text: str) -> tuple[dict[str, list[Instruction]], str]:
    """``({computation: instructions}, entry computation name)`` of an HLO module's text."""
    computations: dict[str, list[Instruction]] = {}
    entry = ""
    current: list[Instruction] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if current is None:
            header = _HEADER.match(stripped)
            if header and not stripped.startswith("HloModule"):
                current = computations.setdefault(header.group(1), [])
                if stripped.startswith("ENTRY"):
                    entry = header.group(1)
            continue
        if stripped == "}":
            current = None
            continue
        instruction = parse_instruction(line)
        if instruction is not None:
            current.append(instruction)
    return computations, entry


def trip_count(instruction: Instruction, computations: dict[str, list[Instruction]]) -> int | None:
    """How often a ``while`` runs: XLA's known trip count, else the bound its condition compares a
    counter with (``counter < N``, counting from 0: what ``lax.scan`` and ``fori_loop`` build)."""
    found = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"', instruction.attributes)
    if found:
        return int(found.group(1))
    for condition in instruction.called("condition"):
        body = computations.get(condition, [])
        named = {i.name: i for i in body}
        for compare in (i for i in body if i.root and i.opcode == "compare" and "direction=LT" in i.attributes):
            bounds = [named[o] for o in compare.operands if o in named and named[o].opcode == "constant"]
            if len(bounds) == 1 and bounds[0].arguments.strip().lstrip("-").isdigit():
                return int(bounds[0].arguments.strip())
    return None


def replica_groups(attributes: str, default_size: int) -> list[list[int]]:
    """The device groups of a collective: explicit ``{{0,1},{2,3}}`` or the iota form ``[2,4]<=[4,2]T(1,0)``."""
    iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attributes)
    if iota:
        shape = [int(n) for n in iota.group(1).split(",")]
        dims = [int(n) for n in iota.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if iota.group(3):
            ids = ids.transpose([int(n) for n in iota.group(3).split(",")])
        return ids.reshape(shape[0], -1).tolist()
    explicit = re.search(r"replica_groups=\{(\{[\d,\s]*\}(?:,\s*\{[\d,\s]*\})*)\}", attributes)
    if explicit:
        return [
            [int(n) for n in group.split(",") if n.strip()]
            for group in re.findall(r"\{([\d,\s]*)\}", explicit.group(1))
        ]
    pairs = re.search(r"source_target_pairs=\{(.*?)\}\s*(?:,|$)", attributes)
    if pairs:
        return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs.group(1))]
    return [list(range(default_size))]


def dot_flops(instruction: Instruction, symbols: dict[str, str]) -> float:
    """2 x output elements x contracted size of a ``dot``."""
    out = shapes(instruction.type)
    if not out or not instruction.operands:
        return 0.0
    lhs = shapes(symbols.get(instruction.operands[0], ""))
    found = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instruction.attributes)
    if not lhs or not found:
        return 0.0
    contracted = math.prod(lhs[0][1][int(d)] for d in found.group(1).split(",") if d)
    return 2.0 * math.prod(out[0][1]) * contracted


def convolution_flops(instruction: Instruction, symbols: dict[str, str]) -> float:
    """Multiply-adds x 2 of a ``convolution`` (TPU programs express matmuls, batched ones included, as
    convolutions): for each output feature and batch row, the kernel's input features times the
    window positions that fall on the input rather than on padding."""
    out = shapes(instruction.type)
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instruction.attributes)
    if not out or len(instruction.operands) < 2 or not labels:
        return 0.0
    lhs = shapes(symbols.get(instruction.operands[0], ""))
    rhs = shapes(symbols.get(instruction.operands[1], ""))
    if not lhs or not rhs:
        return 0.0
    lhs_labels, rhs_labels, out_labels = labels.groups()
    lhs_shape, rhs_shape, out_shape = lhs[0][1], rhs[0][1], out[0][1]
    if not (len(lhs_labels) == len(lhs_shape) and len(rhs_labels) == len(rhs_shape) == len(out_shape)):
        return 0.0
    window = re.search(r"window=\{([^}]*)\}", instruction.attributes)
    fields = dict(re.findall(r"(\w+)=([\w_]+)", window.group(1))) if window else {}
    spatial = sorted(label for label in rhs_labels if label.isdigit())

    def per_dim(key: str, default: str) -> list[str]:
        return fields.get(key, "x".join([default] * len(spatial))).split("x")

    sizes, pads, strides = per_dim("size", "1"), per_dim("pad", "0_0"), per_dim("stride", "1")
    pairs = 1
    for index, label in enumerate(spatial):
        width, low = int(sizes[index]), int(pads[index].split("_")[0])
        stride = int(strides[index])
        length = lhs_shape[lhs_labels.index(label)]
        outputs = out_shape[out_labels.index(label)]
        pairs *= sum(max(0, min(width, length + low - o * stride) - max(0, low - o * stride)) for o in range(outputs))
    rows = out_shape[out_labels.index("b")] * out_shape[out_labels.index("f")]
    return 2.0 * rows * rhs_shape[rhs_labels.index("i")] * pairs


def _backend_config(instruction: Instruction) -> dict[str, object]:
    found = re.search(r"backend_config=(\{.*\})", instruction.attributes)
    if not found:
        return {}
    text = found.group(1)
    end = 0
    depth = 0
    for index, char in enumerate(text):
        depth += char == "{"
        depth -= char == "}"
        if depth == 0:
            end = index + 1
            break
    try:
        parsed = json.loads(text[:end])
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def custom_call_target(instruction: Instruction) -> str:
    """The target a ``custom-call`` calls (``__cudnn$fmhaSoftmax``, ``__cublas$lt$matmul``, ...)."""
    target = re.search(r'custom_call_target="([^"]+)"', instruction.attributes)
    return target.group(1) if target else ""


#: Matmuls of each splash attention kernel (TPUs), by phase: the forward's scores and values; the query
#: gradient recomputes the scores and forms dP and dQ; the key/value gradient recomputes the scores and
#: forms dP, dV and dK, and dQ as well where it is the fused backward (three gradients out, no dq kernel).
_SPLASH_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}
_FUSED_DKV_MATMULS = 5


def splash_flops(instruction: Instruction, symbols: dict[str, str]) -> float:
    """Matmul FLOPs of a splash attention kernel (``splash_mha_<phase>...``), causal: half the square (a
    window or chunks skip more blocks; the count stays at the causal half)."""
    phase = re.search(r"splash_m[hq]a_(fwd|dq|dkv)", instruction.name)
    heads_major = [shape for op in instruction.operands for _, shape in shapes(symbols.get(op, "")) if len(shape) == 4]
    if phase is None or len(heads_major) < 2:
        return 0.0
    (batch, heads, steps, width), keys = heads_major[0], heads_major[1][2]
    matmuls = _SPLASH_MATMULS[phase.group(1)]
    if phase.group(1) == "dkv" and sum(len(shape) == 4 for _, shape in shapes(instruction.type)) >= 3:
        matmuls = _FUSED_DKV_MATMULS
    return 2.0 * matmuls * batch * heads * steps * keys * width * 0.5


def megablox_flops(instruction: Instruction, symbols: dict[str, str]) -> float:
    """Matmul FLOPs of a megablox grouped-matmul kernel (TPUs; a mixture's experts), the routed work:
    ``gmm`` takes rows ``[m, c]`` through their group's ``[c, n]`` (``2 m c n``; its backward for the rows
    too), ``tgmm`` forms the weights' gradient ``[G, k, n]`` from the rows and the output's gradient ``[m, n]``
    (``2 k m n``)."""
    kernel = re.search(r"jit[_(](t?gmm)[_)]", instruction.name + instruction.attributes)
    out = shapes(instruction.type)
    matrices = [shape for op in instruction.operands for _, shape in shapes(symbols.get(op, "")) if len(shape) == 2]
    if kernel is None or not out or not matrices:
        return 0.0
    if kernel.group(1) == "gmm" and len(out[0][1]) == 2:
        return 2.0 * math.prod(out[0][1]) * matrices[0][1]
    if kernel.group(1) == "tgmm" and len(out[0][1]) == 3:  # the rows come last, as [m, n]
        return 2.0 * math.prod(out[0][1][1:]) * matrices[-1][0]
    return 0.0


def custom_call_flops(instruction: Instruction, symbols: dict[str, str]) -> float:
    """Matmul FLOPs of a cuBLAS GEMM, cuDNN attention, splash attention or megablox custom call (0 for
    others)."""
    name = custom_call_target(instruction)
    if name == "tpu_custom_call":
        return splash_flops(instruction, symbols) or megablox_flops(instruction, symbols)
    operand_shapes = [shapes(symbols.get(op, "")) for op in instruction.operands]
    if "gemm" in name or "matmul" in name:
        config = _backend_config(instruction)
        numbers = config.get("gemm_backend_config", config)
        dims = numbers.get("dot_dimension_numbers", {}) if isinstance(numbers, dict) else {}
        contracting = dims.get("lhs_contracting_dimensions", []) if isinstance(dims, dict) else []
        out = shapes(instruction.type)
        if not out or not operand_shapes or not operand_shapes[0]:
            return 0.0
        lhs = operand_shapes[0][0][1]
        return 2.0 * math.prod(out[0][1]) * math.prod(lhs[int(d)] for d in contracting)
    if "fmha" in name and len(operand_shapes) >= 2 and operand_shapes[0] and operand_shapes[1]:
        q, k = operand_shapes[0][0][1], operand_shapes[1][0][1]  # BTNH
        if len(q) != 4 or len(k) != 4:
            return 0.0
        batch, steps, heads, width = q
        keys = k[1]
        causal = 0.5 if "CAUSAL" in instruction.attributes.upper() else 1.0
        matmuls = 5 if "backward" in name.lower() else 2  # forward: QK^T, PV; backward adds recompute + 3
        return 2.0 * matmuls * batch * heads * steps * keys * width * causal
    return 0.0


def analyse(text: str, devices: int) -> ProgramCost:
    """Per-device matmul FLOPs, bytes accessed and collectives of one step of a compiled program."""
    computations, entry = parse_module(text)
    cost = ProgramCost()

    @functools.cache
    def symbols_of(name: str) -> dict[str, str]:
        return {i.name: i.type for i in computations.get(name, [])}

    def own_flops(instruction: Instruction, symbols: dict[str, str]) -> float:
        """Matmul FLOPs of one instruction, the computations it calls included (loops once)."""
        if instruction.opcode == "dot":
            return dot_flops(instruction, symbols)
        if instruction.opcode == "convolution":
            return convolution_flops(instruction, symbols)
        if instruction.opcode == "custom-call":
            return custom_call_flops(instruction, symbols)
        if instruction.opcode in ("fusion", "call", "async-start"):
            return sum(flops_of(c) for c in instruction.called("calls"))
        return 0.0

    @functools.cache
    def flops_of(name: str) -> float:
        """Matmul FLOPs inside computation ``name`` (fusions and nested calls included, loops once)."""
        return sum(own_flops(instruction, symbols_of(name)) for instruction in computations.get(name, []))

    def walk(name: str, repeats: int) -> None:
        symbols = symbols_of(name)
        for instruction in computations.get(name, []):
            opcode = instruction.opcode
            if opcode == "while":
                trips = trip_count(instruction, computations)
                if trips is None:
                    cost.unknown_trip_counts += 1
                    trips = 1
                for body in instruction.called("body") + instruction.called("condition"):
                    walk(body, repeats * trips)
                continue
            if opcode == "conditional":
                branches = instruction.called("branch_computations") or (
                    instruction.called("true_computation") + instruction.called("false_computation")
                )
                if branches:  # one branch runs: count the one with the most matmul work (an upper bound)
                    walk(max(branches, key=flops_of), repeats)
                continue
            if opcode == "call":
                for called in instruction.called("to_apply") + instruction.called("calls"):
                    walk(called, repeats)
                continue
            base = opcode.removesuffix("-start")
            if base in COLLECTIVES:
                data = _collective_bytes(instruction, symbols, base)
                groups = replica_groups(instruction.attributes, devices)
                size = 2 if base == "collective-permute" else max(len(g) for g in groups)
                cost.collectives.append(Collective(base, int(data), size, groups, repeats))
                continue
            if opcode == "async-start":
                for called in instruction.called("calls"):
                    walk(called, repeats)
                continue
            if opcode in _FREE:
                continue
            flops = own_flops(instruction, symbols)
            if opcode == "custom-call" and custom_call_target(instruction):
                target = custom_call_target(instruction)
                cost.custom_calls[target] = cost.custom_calls.get(target, 0) + repeats
            if opcode == "fusion":
                moved = fusion_bytes(instruction, symbols, computations)
            else:
                moved = type_bytes(instruction.type) + sum(
                    type_bytes(symbols.get(op, "")) for op in instruction.operands
                )
            dtype = _matmul_dtype(instruction, symbols, computations) if flops else ""
            cost.kernels.append(Kernel(instruction.name, opcode, flops, moved, repeats, dtype))
            cost.flops += flops * repeats
            cost.bytes_accessed += moved * repeats

    walk(entry, 1)
    return cost


_SLICES = ("dynamic-slice", "slice")


def fusion_bytes(
    instruction: Instruction, symbols: dict[str, str], computations: dict[str, list[Instruction]]
) -> float:
    """Bytes a fusion kernel reads and writes. An operand it only slices is read as the slices (a scanned
    layer reading its weights from the stacked ``[n_layers, ...]`` array reads one layer); a buffer it
    updates in place (``dynamic-update-slice``) costs only the update, read and written."""
    body: list[Instruction] = []
    for called in instruction.called("calls"):
        body = computations.get(called, [])
    inner = {i.name: i for i in body}
    users: dict[str, list[Instruction]] = {}
    for i in body:
        for operand in i.operands:
            users.setdefault(operand, []).append(i)
    parameters = {}
    for i in body:
        if i.opcode == "parameter" and i.arguments.strip().isdigit():
            parameters[int(i.arguments.strip())] = i

    def readers(name: str) -> list[tuple[Instruction, str]]:
        """``(user, the name it reads)`` of ``name``, looking through bitcasts."""
        found = []
        for user in users.get(name, []):
            if user.opcode == "bitcast":
                found += readers(user.name)
            else:
                found.append((user, name))
        return found

    in_place: set[str] = set()
    total = 0.0
    for index, operand in enumerate(instruction.operands):
        whole = type_bytes(symbols.get(operand, ""))
        parameter = parameters.get(index)
        read = readers(parameter.name) if parameter is not None else []
        if read and all(r.opcode in _SLICES and r.operands[0] == via for r, via in read):
            total += sum(type_bytes(r.type) for r, _ in read)
        elif read and all(r.opcode == "dynamic-update-slice" and r.operands[0] == via for r, via in read):
            in_place.update(r.name for r, _ in read)
        else:
            total += whole
    roots = [i for i in body if i.root]
    outputs = [inner.get(name) for name in roots[0].operands] if roots and roots[0].opcode == "tuple" else roots
    written = 0.0
    for output in outputs:
        if output is not None and output.opcode == "dynamic-update-slice" and output.name in in_place:
            written += type_bytes(inner[output.operands[1]].type) if output.operands[1] in inner else 0.0
        elif output is not None:
            written += type_bytes(output.type)
    return total + (written if outputs else type_bytes(instruction.type))


def _collective_bytes(instruction: Instruction, symbols: dict[str, str], base: str) -> float:
    """The payload of one collective: the gathered result of an all-gather, otherwise its operands."""
    if base == "all-gather":
        out = shapes(instruction.type)
        return max((element_bytes(d) * math.prod(s) for d, s in out), default=0.0)
    return sum(type_bytes(symbols.get(op, "")) for op in instruction.operands)


def _matmul_dtype(instruction: Instruction, symbols: dict[str, str], computations: dict[str, list[Instruction]]) -> str:
    """The input dtype of the matmul an instruction runs (its first operand's, or inside its fusion)."""
    inner = instruction
    inner_symbols = symbols
    for called in instruction.called("calls"):
        body = computations.get(called, [])
        dots = [i for i in body if i.opcode in ("dot", "convolution", "custom-call")]
        if dots:
            inner, inner_symbols = dots[0], {i.name: i.type for i in body}
            break
    operands = inner.operands
    if custom_call_target(inner) == "tpu_custom_call":  # a Pallas kernel's first operands are integer tables
        operands = [
            op for op in operands if any(t.startswith(("bf", "f")) for t, _ in shapes(inner_symbols.get(op, "")))
        ]
    found = shapes(inner_symbols.get(operands[0], "")) if operands else []
    return found[0][0] if found else ""


__all__ = ["Collective", "Kernel", "ProgramCost", "analyse", "parse_module", "replica_groups", "shapes"]
