"""A run's plot thread draws with modules the training thread has already loaded.

A worker thread that loads an extension module holds the dynamic loader's lock while the module's
static initialisers run; when they start Python's garbage collector, jax's collector callback waits
for the interpreter lock, which the training thread holds while it waits for the loader's lock to
import a module of its own (orbax at the first checkpoint): a run hung so."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import clean_env

# A fresh interpreter (the test worker has matplotlib loaded already): records which thread loads which
# module while a plotter draws twice, as a run's validations do.
PLOT_TWICE = textwrap.dedent(
    """
    import json, sys, threading
    from pathlib import Path
    loads = []
    def record(event, args):
        if event == "import":
            loads.append((threading.current_thread().name, args[0]))
    sys.addaudithook(record)
    import jax  # its garbage-collector callback, as in a run
    from theseus.tracking.plots import CurvePlotter
    plotter = CurvePlotter(Path(sys.argv[1]) / "loss.png", "tiny")
    plotter.submit([(1, 3.0), (2, 2.5)], [(2, 2.4)])
    plotter.wait()
    plotter.submit([(1, 3.0), (2, 2.5), (3, 2.0)], [(2, 2.4), (3, 2.1)])
    plotter.wait()
    here = threading.current_thread().name
    print(json.dumps({
        "worker": sorted({name for thread, name in loads if thread.startswith("theseus-plot")}),
        "caller": [name for thread, name in loads if thread == here],
    }))
    """
)


def test_the_plot_thread_loads_no_module(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PLOT_TWICE, str(tmp_path)], capture_output=True, text=True, env=clean_env(), timeout=120
    )
    assert done.returncode == 0, done.stderr
    loads = json.loads(done.stdout.splitlines()[-1])
    assert loads["worker"] == []
    assert "matplotlib.ft2font" in loads["caller"] and "matplotlib.backends._backend_agg" in loads["caller"]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
