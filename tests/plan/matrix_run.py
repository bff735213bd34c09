"""Compile training steps for a target in one process and print what ``theseus plan`` reports, as JSON.

Run by tests/plan with the accelerator compilers on its path: ``python matrix_run.py TARGET CASES_JSON``,
where each case is ``{"job": ..., "overrides": [...]}`` (with ``"target"``, a case compiles for that target
instead of TARGET: one process for several targets). A case that fails prints its error instead. A
case with ``"state_only": true`` builds the trainer and reports the state bytes per device it would hold
(``state_bytes``, as a compiled case does) without compiling.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path


def main() -> None:
    from theseus.plan.devices import start_cpu_backend

    start_cpu_backend()
    from theseus.plan.hlo import parse_module, shapes
    from theseus.plan.report import as_dict, make_plan
    from theseus.registry import get_registry

    default, cases = sys.argv[1], json.loads(sys.argv[2])
    root = Path(tempfile.mkdtemp())
    for case in cases:
        target = case.get("target", default)
        try:
            if "generate" in case:
                print(json.dumps({"case": case, "generate": compile_generation(target, case, root)}), flush=True)
                continue
            if case.get("state_only"):
                print(json.dumps({"case": case, "plan": {"state_bytes": state_bytes(target, case, root)}}), flush=True)
                continue
            job = get_registry().load_job(case["job"])
            plan = make_plan(case["job"], job, target, case["overrides"], root)
        except Exception as exc:
            print(json.dumps({"case": case, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
            continue
        report = as_dict(plan)
        computations, _ = parse_module(plan.step.text)
        attention_operands, splash = [], set()
        for body in computations.values():
            symbols = {i.name: i.type for i in body}
            for instruction in body:
                if instruction.opcode == "custom-call" and "fmha" in instruction.attributes:
                    attention_operands.append([shapes(symbols.get(o, ""))[0][1] for o in instruction.operands])
                kernel = re.search(r"splash_m[hq]a_(fwd|dq|dkv)", instruction.name)
                if instruction.opcode == "custom-call" and kernel:
                    splash.add(kernel.group(1))
        report["attention_operands"] = attention_operands
        report["splash"] = sorted(splash)  # the splash attention kernels (TPUs): fwd, and dq and dkv backward
        report["state_bytes"] = report["memory"]["parameters"] + report["memory"]["optimizer_state"]
        if case.get("held"):  # bytes per device by kind: frozen projection kernels, adapters, optimizer state
            sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
            from benchmarks.plan_estimates import held_by_kind

            report["held"] = held_by_kind(plan)
        print(json.dumps({"case": case, "plan": report}, default=str), flush=True)


def state_bytes(target: str, case: dict, root: Path) -> int:
    """The parameter and optimizer-state bytes one device holds in ``case``'s layout, from the abstract
    state and its shardings: what a compiled case reports as ``state_bytes``, without the compile."""
    from theseus.plan.build import build_trainer, held_bytes
    from theseus.plan.devices import target_devices
    from theseus.plan.targets import parse_target
    from theseus.registry import get_registry

    job = get_registry().load_job(case["job"])
    trainer = build_trainer(job, target_devices(parse_target(target)), case["overrides"], root)
    state, shardings = trainer.abstract_state, trainer.state_shardings
    return held_bytes(state.params, shardings.params) + held_bytes(state.opt_state, shardings.opt_state)


def compile_generation(target: str, case: dict, root: Path) -> dict:
    """Compile sampling (prefill of left-padded prompts, then cached decode steps) for the target's mesh."""
    import jax
    import jax.numpy as jnp

    from theseus.model.generation.decode import _sample, cache_layout, view_limits
    from theseus.model.generation.sampling import SamplingParams
    from theseus.model.stack.decoding import unrolled_model
    from theseus.plan.build import build_trainer
    from theseus.plan.devices import target_devices
    from theseus.plan.hlo import analyse
    from theseus.plan.targets import parse_target
    from theseus.registry import get_registry
    from theseus.training.state import with_shardings

    spec = parse_target(target)
    job = get_registry().load_job(case["job"])
    trainer = build_trainer(job, target_devices(spec), case["overrides"], root)
    sharding = trainer.sharding
    params = with_shardings(trainer.abstract_state.params, trainer.state_shardings.params)
    rows = sharding.batch_sharding(2)
    batch, prompt = case["generate"]["batch"], case["generate"]["prompt"]
    ids = jax.ShapeDtypeStruct((batch, prompt), jnp.int32, sharding=rows)
    mask = jax.ShapeDtypeStruct((batch, prompt), jnp.bool_, sharding=rows)
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding.replicated)
    stops = jax.ShapeDtypeStruct((1,), jnp.int32, sharding=sharding.replicated)
    new = case["generate"]["new"]
    cache = cache_layout(unrolled_model(trainer.model), batch, prompt + new - 1, sharding)  # the decoder's layout
    with sharding.context():
        compiled = (
            _sample.trace(
                params,
                cache,
                ids,
                mask,
                scalar,
                stops,
                model=trainer.model,
                max_new_tokens=new,
                sampling=SamplingParams(),
                limits=tuple(view_limits(prompt, new)),
            )
            .lower()
            .compile()
        )
    cost = analyse(compiled.as_text(), spec.devices)
    return {"flops": cost.flops, "custom_calls": cost.custom_calls, "collectives": cost.collective_summary()}


if __name__ == "__main__":
    main()
