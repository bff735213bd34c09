"""``theseus components --kind environment|reward`` lists them, in-process; nothing on these paths imports jax."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import clean_env
from theseus.cli.main import main


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().out


def test_components_by_kind_list_environments_and_rewards(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = cli(["components", "--kind", "environment"], capsys)
    listed = {line.split()[0] for line in out.splitlines()[1:]}
    assert code == 0 and {"environment/arithmetic", "environment/countdown", "environment/jsonl"} <= listed
    assert all(key.startswith("environment/") for key in listed)
    code, out = cli(["components", "--kind", "reward"], capsys)
    listed = {line.split()[0] for line in out.splitlines()[1:]}
    assert code == 0 and {"reward/correct", "reward/format", "reward/overlong", "reward/countdown"} <= listed
    code, out = cli(["components", "environment/countdown"], capsys)
    assert code == 0 and "environment/countdown/numbers" in out and "int    4" in out
    code, out = cli(["components", "reward/format"], capsys)
    assert code == 0 and "reward/format/tag" in out


def test_environments_and_rewards_import_no_jax() -> None:
    code = (
        "import sys\n"
        "from theseus.cli.main import main\n"
        "from theseus.rl import load_environment, load_reward\n"
        "main(['components', '--kind', 'environment'])\n"
        "main(['components', 'reward/overlong'])\n"
        "for name in ('arithmetic', 'countdown'):\n"
        "    env = load_environment(name)\n"
        "    env.score(env.prompts('train', 0, 0, 2), ['a', 'b'])\n"
        "load_reward('overlong')\n"
        "print('HEAVY', [m for m in ('jax', 'flax', 'numpy') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout
