"""Developer sessions: the full test suite, per-distribution isolation, lint and typecheck."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "isolated", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True

DISTRIBUTIONS = {
    # distribution -> the local distributions it depends on (installed from this repo)
    "theseus-core": [],
    "theseus-models": ["theseus-core"],
    "theseus-data": ["theseus-core"],
    "theseus-plugins-example": ["theseus-core", "theseus-models", "theseus-data"],
}
PACKAGES = {
    "theseus-core": "theseus-core/src",
    "theseus-models": "theseus-models/src",
    "theseus-data": "theseus-data/src",
    "theseus-plugins-example": "theseus-plugins-example/src",
}

#: A demo of a few steps on a few files: core + models must train on the offline path by themselves.
OFFLINE_DEMO = [
    "architecture/n_layers=1",
    "architecture/n_embd=32",
    "architecture/n_heads=2",
    "architecture/block_size=32",
    "training/sequence_length=32",
    "training/steps=3",
    "data/max_documents=48",
    "data/val_fraction=0.125",
    "demo/max_new_tokens=8",
]

IMPORT_ALL = """
import importlib, pathlib, sys
root = pathlib.Path(sys.argv[1])
failed = []
for path in sorted(root.rglob("*.py")):
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    if module.endswith("__main__"):
        continue
    module = module.removesuffix(".__init__")
    try:
        importlib.import_module(module)
    except Exception as exc:
        failed.append(f"{module}: {type(exc).__name__}: {exc}")
print("\\n".join(failed) or f"imported every module under {root}")
sys.exit(1 if failed else 0)
"""


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The whole test suite with all four distributions installed."""
    session.install("-r", "requirements-dev.txt")
    session.run("python", "-m", "pytest", *(session.posargs or ["-n", "2", "--dist", "loadfile"]))


@nox.session(python="3.11")
@nox.parametrize("distribution", list(DISTRIBUTIONS))
def isolated(session: nox.Session, distribution: str) -> None:
    """One distribution with only its declared dependencies: every module must import."""
    local = [f"./{d}" for d in (*DISTRIBUTIONS[distribution], distribution)]
    session.install(*local)
    session.run("python", "-c", IMPORT_ALL, PACKAGES[distribution], external=False)
    session.run("theseus", "jobs")
    if distribution == "theseus-models":
        session.run("theseus", "run", "demo/gpt", *OFFLINE_DEMO, "--root", session.create_tmp())


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff lint and format check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy over the four distributions."""
    session.install("-r", "requirements-dev.txt")
    session.run("mypy", *PACKAGES.values())
