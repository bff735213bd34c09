"""``theseus components KIND/NAME``: keys, types, defaults, help and provider, read without importing."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import clean_env, run_cli


def rows(text: str) -> dict[str, list[str]]:
    """``{key: [type, default, help...]}`` of the table (columns split on two spaces)."""
    table: dict[str, list[str]] = {}
    for line in text.splitlines()[2:]:
        cells = [c.strip() for c in line.split("  ") if c.strip()]
        table[cells[0]] = cells[1:]
    return table


def test_detail_of_a_core_optimizer_and_a_plugin_model() -> None:
    done = run_cli(["components", "optimizer/lion"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("optimizer/lion  provided by theseus-core ")
    assert rows(done.stdout) == {
        "optimizer/lion/beta1": ["float", "0.9", "[>= 0.0 and < 1.0]"],
        "optimizer/lion/beta2": ["float", "0.99", "[>= 0.0 and < 1.0]"],
        "optimizer/lion/weight_decay": ["float", "0.1", "decoupled weight decay of matrices"],
    }
    # A plugin model: GPT's keys through its components(), plus the plugin's own child module's key.
    done = run_cli(["components", "model/example-scaled-gpt"])
    assert done.returncode == 0, done.stderr
    assert "provided by theseus-plugins-example" in done.stdout.splitlines()[0]
    table = rows(done.stdout)
    assert table["architecture/scale"] == ["float", "1.0", "factor applied by Scale modules"]
    assert table["architecture/n_layers"][:2] == ["int | None", "None"]
    assert "architecture/rope_theta" not in table  # a Llama key
    llama = rows(run_cli(["components", "model/llama"]).stdout)
    assert llama["architecture/rope_theta"][:2] == ["float", "10000.0"]


def test_keys_declared_through_helpers_that_return_a_field_are_listed() -> None:
    """``architecture_field(name)`` (a shared table of keyword arguments), ``optional_key(key, what)`` and
    ``mamba_key(name)`` (a tuple unpacked, ``min=None`` meaning no bound) return ``field(...)``: their keys
    are read through the helper, with its arguments bound."""
    gpt = rows(run_cli(["components", "model/gpt"]).stdout)
    assert gpt["architecture/n_embd"][:2] == ["int | None", "None"]
    assert gpt["architecture/dropout"][:2] == ["float", "0.0"]
    # help built by joining a dict's keys, choices by tuple(): the names, not the source text
    activation = gpt["architecture/activation"][2]
    assert activation.startswith("gelu | gelu_exact | relu") and "[one of gelu, gelu_exact, relu" in activation
    nemotron = rows(run_cli(["components", "model/nemotron_h"]).stdout)
    assert nemotron["architecture/n_layers"] == ["int | None", "None", "transformer layers (None: preset)"]
    assert nemotron["architecture/mamba_chunk_size"] == ["int", "128", "chunk of Mamba-2's chunked scan [>= 1]"]
    assert nemotron["architecture/mamba_bias"] == ["bool", "False", "biases on Mamba-2's in_proj and out_proj"]


def test_a_kind_alone_lists_that_kind() -> None:
    done = run_cli(["components", "optimizer"])
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines()[1:]]
    assert {"optimizer/adamw", "optimizer/lion", "optimizer/example-nadamw"} <= set(listed)
    assert all(key.startswith("optimizer/") for key in listed)


def test_an_unknown_component_lists_the_registered_ones() -> None:
    done = run_cli(["components", "schedule/cosin"])
    assert done.returncode == 2
    assert done.stderr.startswith("error: unknown schedule 'cosin' (theseus components schedule/cosin); did you mean")
    assert "constant, cosine, linear, wsd (theseus-core); example-rsqrt (theseus-plugins-example)" in done.stderr


def test_detail_does_not_import_heavy_libraries() -> None:
    code = (
        "import sys\n"
        "from theseus.cli.main import main\n"
        "for key in ('model/gpt', 'optimizer/muon', 'dataset/fineweb', 'evaluation/example-next-token'):\n"
        "    main(['components', key])\n"
        "heavy = ('jax', 'flax', 'optax', 'datasets', 'orbax', 'tokenizers', 'torch')\n"
        "print('HEAVY', [m for m in heavy if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout and "optimizer/muon/ns_steps" in done.stdout
