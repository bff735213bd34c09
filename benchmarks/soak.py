"""Soak: a two-process training run SIGKILLed and SIGTERMed at random points, then finished, against an
uninterrupted run of the same two processes.

    python benchmarks/soak.py [--cycles 24] [--seed S] [--launcher auto|srun|local] [--steps 120]

Prepares the offline corpus (byte tokens), trains ``train/pretrain`` (tiny preset, one layer, a
checkpoint every 3 steps, all kept) as 2 processes started by a launcher: SLURM's ``srun -n 2
--kill-on-bad-exit=1`` when ``srun`` works on this machine, else the framework's own local launch (two
processes given ``THESEUS_COORDINATOR``, ``THESEUS_NUM_PROCESSES`` and ``THESEUS_PROCESS_ID``; when one
dies of a signal the other is killed, as srun does). First the uninterrupted reference run, then the
soaked run: every cycle runs the same command with one signal at a point drawn from the seed, and
the next cycle resumes from what the last one left. A point is a process (0 or 1), a phase and an
update (``THESEUS_TEST_KILL_AT``, see ``theseus.base.killpoints``):

- SIGKILL in ``data`` (batch read), ``step`` (update dispatched) or ``save`` (checkpoint being written):
  the process dies at once, the launcher ends the other, and the run resumes from the last committed
  checkpoint;
- SIGTERM in ``data`` or ``step``: both processes stop two updates later with a checkpoint and exit 75.

After every cycle each committed checkpoint is checked against its checksum manifest
(``theseus.checkpoint.integrity.damage``) and none may have been set aside as damaged; the resume
point must be the newest committed checkpoint. After the last cycle the run is finished, and its
``metrics.jsonl`` (losses, gradient norms, learning rates, the final evaluation; timing fields
aside) must equal the reference's bit for bit. Prints a table per cycle and a summary; exits 1
when a check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_line, today
from benchmarks.first_step import _env, theseus_command

PROCESSES = 2
RUN = "soak"
REFERENCE = "reference"
CHECKPOINT_INTERVAL = 3
#: Fields of a metrics row that depend on wall time, not on the computation.
TIMING = {"tokens_per_sec", "step_time", "mfu"}
#: The per-rank variables the srun worker reads (``--worker``).
KILL_RANK, KILL_AT = "SOAK_KILL_RANK", "SOAK_KILL_AT"
RESUMED = re.compile(r"resuming run '[^']+' from step (\d+)")
LOGGED = re.compile(r"^step \d+/\d+ ", re.MULTILINE)
STOPPED = re.compile(r"stopped at step (\d+)/(\d+) with a checkpoint")


def settings(root: Path, name: str, steps: int) -> list[str]:
    """``run train/pretrain`` with the soak's model and schedule."""
    return [
        *("run", "train/pretrain", "--root", str(root)),
        "architecture/preset=tiny",
        "architecture/n_layers=1",
        "architecture/vocab_size=260",
        "architecture/block_size=32",
        "training/batch_size=8",
        f"training/steps={steps}",
        "training/log_interval=1",
        "training/eval_batches=0",
        f"training/checkpoint_interval={CHECKPOINT_INTERVAL}",
        "training/keep_checkpoints=0",
        "training/progress=false",
        f"run/name={name}",
    ]


@dataclasses.dataclass
class Ended:
    """How one launch of the two processes ended: the launcher's exit code, each process's stderr and,
    where the launcher tells them apart, each process's exit code (negative: the signal)."""

    code: int
    errors: list[str]
    codes: list[int] | None
    launcher_log: str
    seconds: float


class Local:
    """The framework's own launch: two processes on this machine joined through ``THESEUS_COORDINATOR``."""

    name = "local (THESEUS_COORDINATOR / THESEUS_NUM_PROCESSES / THESEUS_PROCESS_ID)"

    def launch(self, args: list[str], logs: Path, kill: tuple[int, str] | None) -> Ended:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        began = time.perf_counter()
        processes, files = [], []
        for rank in range(PROCESSES):
            env = _env()
            env.update(THESEUS_COORDINATOR=f"127.0.0.1:{port}", THESEUS_NUM_PROCESSES=str(PROCESSES))
            env["THESEUS_PROCESS_ID"] = str(rank)
            if kill is not None and kill[0] == rank:
                env["THESEUS_TEST_KILL_AT"] = kill[1]
            err = open(logs.with_name(f"{logs.name}-{rank}.err"), "w")  # noqa: SIM115 - closed below
            files.append(err)
            processes.append(subprocess.Popen([*theseus_command(), *args], env=env, stdout=err, stderr=err))
        ended_by_signal = False
        while any(p.poll() is None for p in processes):
            if not ended_by_signal and any((p.returncode or 0) < 0 for p in processes):
                ended_by_signal = True  # as srun --kill-on-bad-exit: end the others of the step
                for other in processes:
                    if other.poll() is None:
                        other.kill()
            time.sleep(0.1)
        for err in files:
            err.close()
        codes = [p.returncode for p in processes]
        errors = [logs.with_name(f"{logs.name}-{rank}.err").read_text() for rank in range(PROCESSES)]
        worst = next((c for c in codes if c < 0), max(codes))
        return Ended(worst, errors, codes, "", time.perf_counter() - began)


class Srun:
    """SLURM: ``srun -n 2 --kill-on-bad-exit=1``; JAX detects the processes from SLURM's variables."""

    name = "srun -n 2 (SLURM, detected by jax)"

    @staticmethod
    def works() -> bool:
        """Whether ``srun`` is installed and starts two tasks here within a minute."""
        if shutil.which("srun") is None:
            return False
        try:
            done = subprocess.run(
                ["srun", "-n", str(PROCESSES), "true"], capture_output=True, text=True, timeout=60, env=_env()
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    def launch(self, args: list[str], logs: Path, kill: tuple[int, str] | None) -> Ended:
        env = _env()
        if kill is not None:
            env[KILL_RANK], env[KILL_AT] = str(kill[0]), kill[1]
        command = [
            *("srun", "-n", str(PROCESSES), "--kill-on-bad-exit=1"),
            f"--output={logs}-%t.out",
            f"--error={logs}-%t.err",
            *(sys.executable, str(Path(__file__).resolve()), "--worker", *args),
        ]
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
        errors = [logs.with_name(f"{logs.name}-{rank}.err").read_text() for rank in range(PROCESSES)]
        return Ended(done.returncode, errors, None, done.stderr, time.perf_counter() - began)


def worker(args: list[str]) -> None:
    """One srun task: arm the kill point if it is this task's, then become ``theseus ARGS``."""
    if os.environ.get(KILL_RANK) is not None and os.environ.get(KILL_RANK) == os.environ.get("SLURM_PROCID"):
        os.environ["THESEUS_TEST_KILL_AT"] = os.environ[KILL_AT]
    command = [*theseus_command(), *args]
    os.execv(command[0], command)


@dataclasses.dataclass
class Cycle:
    """One interrupted launch: the point drawn, and what was found after it."""

    index: int
    signal: str
    rank: int
    phase: str
    step: int
    start: int  # the newest committed checkpoint before the launch (0: none)
    resumed_from: int | None = None
    ended: str = ""
    checkpoints: int = 0
    trained: int = 0  # updates process 0 logged
    seconds: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def point(self) -> str:
        return f"{self.phase}:{self.step}" + (":TERM" if self.signal == "TERM" else "")


def committed(run_dir: Path) -> list[int]:
    """Steps of the committed checkpoints of a run."""
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def verify(run_dir: Path) -> tuple[int, list[str]]:
    """Check every committed checkpoint against its checksum manifest: ``(count, problems)``."""
    from theseus.checkpoint import integrity

    folder = run_dir / "checkpoints"
    problems = [f"checkpoint {p.name} was set aside as damaged" for p in folder.glob("*.corrupt")]
    steps = committed(run_dir)
    for step in steps:
        state = folder / str(step) / "state"
        if not integrity.has_manifest(state):
            problems.append(f"checkpoint {step} has no checksum manifest")
        elif (damage := integrity.damage(state)) is not None:
            problems.append(f"checkpoint {step}: {damage}")
    return len(steps), problems


def draw(rng: random.Random, index: int, start: int, steps: int) -> Cycle | None:
    """The next point: a signal, a process, a phase and an update after ``start`` (None: too near the end)."""
    last = steps - 3  # a SIGTERM stops two updates later, before the last update
    if start + 1 > last:
        return None
    kind = rng.choice(["KILL", "TERM"])
    rank = rng.randrange(PROCESSES)
    step = rng.randint(start + 1, min(start + 2 * CHECKPOINT_INTERVAL, last))
    phases = ["data", "step"]
    if kind == "KILL":
        saving = [s for s in range(start + 1, min(start + 2 * CHECKPOINT_INTERVAL, last) + 1)]
        saving = [s for s in saving if s % CHECKPOINT_INTERVAL == 0]
        if saving:
            phases.append("save")
    phase = rng.choice(phases)
    if phase == "save":
        step = rng.choice(saving)
    return Cycle(index, kind, rank, phase, step, start)


def metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def resumed_from(error: str) -> int:
    found = RESUMED.search(error)
    return int(found.group(1)) if found else 0


def check_ending(cycle: Cycle, ended: Ended, run_dir: Path) -> None:
    """Record how the launch ended and whether that is what the signal should have done."""
    if cycle.signal == "TERM":
        # srun --kill-on-bad-exit cancels the step once one process has exited 75: the other may be ended
        # after its stop line (slurmstepd then appends "CANCELLED" to its log)
        stops = [int(found.group(1)) for error in ended.errors if (found := STOPPED.search(error))]
        stop = cycle.step + 2
        cycle.ended = f"exit {ended.code}, stopped at {'/'.join(map(str, stops)) or '?'}"
        # srun's exit is then 143 (SIGTERM), although both processes stopped with the checkpoint
        ended_by_srun = ended.codes is None and ended.code == 128 + signal.SIGTERM and len(stops) == PROCESSES
        if ended_by_srun:
            cycle.ended += " (srun ended a process after its stop line)"
        elif ended.code != 75 or (ended.codes is not None and ended.codes != [75] * PROCESSES):
            cycle.problems.append(f"SIGTERM: exit {ended.codes or ended.code}, expected 75")
        if not stops or any(found != stop for found in stops):
            cycle.problems.append(f"SIGTERM at {cycle.step}: expected a stop at {stop}, the processes said {stops}")
        if stop not in committed(run_dir):
            cycle.problems.append(f"SIGTERM at {cycle.step}: no committed checkpoint {stop}")
    else:
        cycle.ended = f"exit {ended.code}"
        if ended.codes is not None and ended.codes[cycle.rank] != -signal.SIGKILL:
            cycle.problems.append(f"process {cycle.rank} ended with {ended.codes[cycle.rank]}, not SIGKILL")
        if ended.codes is None and not re.search(rf"task {cycle.rank}: Killed", ended.launcher_log):
            cycle.problems.append(f"srun does not report task {cycle.rank} killed: {ended.launcher_log[-300:]!r}")
        if ended.code in (0, 75):
            cycle.problems.append(f"SIGKILL: the launch exited {ended.code}")


def soak(launcher: Local | Srun, root: Path, cycles: int, seed: int, steps: int) -> dict[str, Any]:
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    reference = launcher.launch(settings(root, REFERENCE, steps), logs / "reference", None)
    if reference.code != 0:
        raise SystemExit(f"the reference run failed (exit {reference.code}): {reference.errors[0][-2000:]}")
    rng = random.Random(seed)
    run_dir = root / "runs" / RUN
    done: list[Cycle] = []
    soak_began = time.perf_counter()
    for index in range(1, cycles + 1):
        start = max(committed(run_dir), default=0)
        cycle = draw(rng, index, start, steps)
        if cycle is None:
            break
        ended = launcher.launch(settings(root, RUN, steps), logs / f"cycle{index:02d}", (cycle.rank, cycle.point))
        cycle.seconds = ended.seconds
        cycle.resumed_from = resumed_from(ended.errors[0])
        cycle.trained = len(LOGGED.findall(ended.errors[0]))
        if cycle.resumed_from != start:
            cycle.problems.append(f"resumed from {cycle.resumed_from}, the newest checkpoint was {start}")
        check_ending(cycle, ended, run_dir)
        cycle.checkpoints, problems = verify(run_dir)
        cycle.problems += problems
        done.append(cycle)
        print(row(cycle), flush=True)
    start = max(committed(run_dir), default=0)
    final = launcher.launch(settings(root, RUN, steps), logs / "final", None)
    verified, final_problems = verify(run_dir)
    if final.code != 0:
        final_problems.append(f"the final launch exited {final.code}: {final.errors[0][-1000:]}")
    if resumed_from(final.errors[0]) != start:
        final_problems.append(f"the final launch resumed from {resumed_from(final.errors[0])}, not {start}")
    soak_seconds = time.perf_counter() - soak_began
    ours, theirs = metric_rows(run_dir), metric_rows(root / "runs" / REFERENCE)
    losses = [(r["step"], r["loss"]) for r in ours if r["split"] == "train"]
    expected = [(r["step"], r["loss"]) for r in theirs if r["split"] == "train"]
    return {
        "cycles": done,
        "final_start": start,
        "final_trained": len(LOGGED.findall(final.errors[0])),
        "final_problems": final_problems,
        "verified_at_end": verified,
        "losses_equal": losses == expected and len(expected) == steps,
        "rows_equal": ours == theirs,
        "max_loss_difference": max((abs(a[1] - b[1]) for a, b in zip(losses, expected, strict=False)), default=0.0),
        "reference_seconds": reference.seconds,
        "soak_seconds": soak_seconds,
        "total_seconds": time.perf_counter() - began,
    }


HEADER = (
    "| cycle | signal | process | point | resumed from | ended | checkpoints verified | seconds | problems |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def row(cycle: Cycle) -> str:
    problems = "; ".join(cycle.problems).replace("|", "\\|") or "none"
    return (
        f"| {cycle.index} | SIG{cycle.signal} | {cycle.rank} | {cycle.point} | {cycle.resumed_from} | {cycle.ended} "
        f"| {cycle.checkpoints} | {cycle.seconds:.1f} | {problems} |"
    )


def summary(result: dict[str, Any], launcher: str, seed: int, steps: int) -> str:
    cycles: list[Cycle] = result["cycles"]
    kills = sum(c.signal == "KILL" for c in cycles)
    problems = sum(len(c.problems) for c in cycles) + len(result["final_problems"])
    resumed = [c.resumed_from for c in cycles[1:]] + [result["final_start"]]
    trained = sum(c.trained for c in cycles) + result["final_trained"]
    ended_by_srun = sum("srun ended" in c.ended for c in cycles)
    verifications = sum(c.checkpoints for c in cycles)
    lines = [
        f"### Soak ({today()} · {machine_line()})",
        "",
        "| Figure | Value |",
        "|---|---|",
        f"| launcher | {launcher} |",
        f"| seed | {seed} |",
        f"| cycles (interrupted launches) | {len(cycles)} |",
        f"| SIGKILLs / SIGTERMs | {kills} / {len(cycles) - kills} |",
        f"| SIGTERMs that srun ended with exit 143 after both stop lines | {ended_by_srun} |",
        f"| resumed from steps | {', '.join(str(s) for s in resumed)} |",
        f"| updates trained over all launches / in the run | {trained} / {steps} |",
        f"| checkpoint verifications over all cycles / problems found | {verifications} / {problems} |",
        f"| losses equal to the uninterrupted run, bit for bit | {'yes' if result['losses_equal'] else 'NO'} "
        f"(max difference {result['max_loss_difference']:.3g}) |",
        f"| all metrics rows equal (timing fields aside) | {'yes' if result['rows_equal'] else 'NO'} |",
        f"| time: reference / soak (all cycles + finish) | {result['reference_seconds']:.0f} s / "
        f"{result['soak_seconds']:.0f} s |",
    ]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=24)
    parser.add_argument("--seed", type=int, default=None, help="of the kill points (default: drawn and printed)")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--launcher", choices=["auto", "srun", "local"], default="auto")
    parser.add_argument("--root", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--output", type=Path, default=None, help="also write the tables here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    if args.launcher == "srun" or (args.launcher == "auto" and Srun.works()):
        launcher: Local | Srun = Srun()
    else:
        launcher = Local()
    print(f"seed {seed} (python benchmarks/soak.py --seed {seed} repeats these points); launcher {launcher.name}")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp)
        prepare = [*theseus_command(), "run", "data/tokenize", "data/max_documents=200", "--root", str(root)]
        subprocess.run(prepare, check=True, capture_output=True, env=_env(), timeout=600)
        print(HEADER, flush=True)
        result = soak(launcher, root, args.cycles, seed, args.steps)
    table = summary(result, launcher.name, seed, args.steps)
    print()
    print(table)
    for problem in result["final_problems"]:
        print(f"problem: {problem}")
    if args.output:
        args.output.write_text("\n".join([HEADER, *map(row, result["cycles"]), "", table]) + "\n")
    failed = result["final_problems"] or any(c.problems for c in result["cycles"])
    if failed or not (result["losses_equal"] and result["rows_equal"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
