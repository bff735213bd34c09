"""The Flywheel loader: batch contents, purity in (seed, step, split), elastic shares, mixing, padded rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.data.conftest import write_prepared
from theseus.data.datasets import FineWeb, Instructions, PythonStdlib
from theseus.training.flywheel import Flywheel, Sampling, Strategy, strategy_of

EOT = 65535
VOCAB = 65536


def ramp(root: Path, name: str, *, first: int = 0, tokens: int = 30000, doc: int = 1000) -> None:
    """Prepared data where the token at shard position p is ``first + p`` (EOT ends each document)."""

    def docs(offset: int, count: int) -> list[list[int]]:
        return [list(range(offset + s, offset + s + doc - 1)) for s in range(0, count, doc)]

    write_prepared(
        root,
        name,
        {"train": docs(first, tokens), "val": docs(first + tokens, 3 * doc)},
        vocab_size=VOCAB,
        eot_id=EOT,
    )


def window_start(row: np.ndarray, first: int = 0) -> int:
    """Shard position of a pmd row's first token (rows are contiguous windows of a ramp)."""
    return int(row[0]) - first if row[0] != EOT else int(row[1]) - first - 1


def test_pmd_rows_are_contiguous_windows_with_shifted_targets(root: Path) -> None:
    ramp(root, "ramp")
    shard = np.fromfile(root / "data" / "ramp" / "train.bin", dtype=np.uint16).astype(np.int32)
    with Flywheel(Sampling("ramp", 1.0, "pmd"), root=root, block_size=64, batch_size=8, seed=3) as fw:
        batch = fw.batch(0)
    assert set(batch) == {"x", "y", "padding_mask"}
    assert batch["x"].dtype == np.int32 and batch["y"].dtype == np.int32 and batch["padding_mask"].dtype == bool
    assert batch["x"].shape == batch["y"].shape == batch["padding_mask"].shape == (8, 64)
    assert batch["padding_mask"].all()
    for x, y in zip(batch["x"], batch["y"], strict=True):
        s = window_start(x)
        assert np.array_equal(x, shard[s : s + 64]) and np.array_equal(y, shard[s + 1 : s + 65])
    assert len({window_start(x) for x in batch["x"]}) == 8  # random places, not one window repeated


def test_same_seed_same_batches_and_restart_continues_exactly(root: Path) -> None:
    ramp(root, "ramp")

    def make(seed: int, prefetch: int = 2) -> Flywheel:
        return Flywheel("ramp", root=root, block_size=32, batch_size=4, seed=seed, prefetch=prefetch)

    unbroken, twin, other = make(7), make(7, prefetch=0), make(8)
    run = [unbroken.batch(step) for step in range(6)]
    for step, batch in enumerate(run):
        same = twin.batch(step)
        for key in batch:
            assert np.array_equal(batch[key], same[key])
    assert not np.array_equal(run[2]["x"], other.batch(2)["x"])
    restarted = make(7)  # a new process resuming at step 4
    for step in (4, 5):
        assert np.array_equal(restarted.batch(step)["x"], run[step]["x"])
        assert np.array_equal(restarted.batch(step)["y"], run[step]["y"])
    # val batches are their own sequence, equally deterministic
    assert not np.array_equal(unbroken.batch(0, "val")["x"], run[0]["x"])
    assert np.array_equal(unbroken.batch(1, "val")["x"], restarted.batch(1, "val")["x"])
    assert int(unbroken.batch(0, "val")["x"].min()) >= 30000  # val tokens come from val.bin
    for fw in (unbroken, twin, other, restarted):
        fw.close()


def test_batches_are_fresh_arrays(root: Path) -> None:
    ramp(root, "ramp")
    with Flywheel("ramp", root=root, block_size=16, batch_size=2, seed=0) as fw:
        first = fw.batch(3)
        keep = {k: v.copy() for k, v in first.items()}
        first["y"][..., 0] = -1
        first["x"][:] = 0
        again = fw.batch(3)
    assert not np.shares_memory(first["x"], first["y"])
    for key in keep:
        assert np.array_equal(again[key], keep[key])


def test_the_global_batch_does_not_depend_on_processes_or_micro_batches(root: Path) -> None:
    ramp(root, "low", first=0, tokens=20000)
    ramp(root, "high", first=30000, tokens=20000)
    mix = [Sampling("low", 0.6, "pmd"), Sampling("high", 0.4, "pmd")]

    def shares(processes: int, micro: int, step: int) -> list[dict[str, np.ndarray]]:
        out = []
        for p in range(processes):
            with Flywheel(
                mix,
                root=root,
                block_size=20,
                batch_size=8,
                seed=1,
                process_index=p,
                process_count=processes,
                micro_batches=micro,
                prefetch=0,
            ) as fw:
                out.append({"rows": fw.rows, **fw.batch(step, "train")})
        return out

    for step in (0, 5):
        (whole,) = shares(1, 1, step)
        assert whole["x"].shape == (8, 20) and whole["rows"].tolist() == list(range(8))
        for processes, micro in ((2, 1), (4, 1), (2, 2), (1, 4), (2, 4)):
            parts = shares(processes, micro, step)
            rows = np.concatenate([part["rows"] for part in parts])
            assert sorted(rows.tolist()) == list(range(8))  # disjoint, and together the whole batch
            for part in parts:
                assert part["x"].shape == (8 // processes, 20)
                for key in ("x", "y", "padding_mask"):
                    assert np.array_equal(part[key], whole[key][part["rows"]]), (processes, micro, key)
    # A process feeds its share of every micro-batch: 2 processes, 2 micro-batches of 4 rows.
    assert [part["rows"].tolist() for part in shares(2, 2, 0)] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert not np.array_equal(shares(1, 1, 0)[0]["x"], shares(1, 1, 1)[0]["x"])


def test_mixture_rates_hold_over_many_batches(root: Path) -> None:
    ramp(root, "low", first=0, tokens=20000)
    ramp(root, "high", first=30000, tokens=20000)
    mix = [Sampling("low", 0.7, "pmd"), Sampling("high", 0.3, "pmd")]
    rows = high = 0
    with Flywheel(mix, root=root, block_size=16, batch_size=16, seed=5) as fw:
        for step in range(300):
            x = fw.batch(step)["x"]
            from_high = np.where(x[:, 0] != EOT, x[:, 0], x[:, 1]) >= 30000
            rows += x.shape[0]
            high += int(from_high.sum())
    assert rows == 4800
    assert abs(high / rows - 0.3) < 0.03


def test_padded_rows_hold_one_document_and_learn_only_the_response(root: Path) -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 500, size=int(n)).tolist() for n in rng.integers(5, 40, size=30)]
    prompts = [int(rng.integers(0, len(d))) for d in docs]
    write_prepared(
        root,
        "chat",
        {"train": docs, "val": sorted(docs, key=len)[-3:]},
        vocab_size=1000,
        prompts={"train": prompts, "val": [0, 0, 0]},
        style="padded",
    )
    by_first = {tuple(d[:3]): (d, p) for d, p in zip(docs, prompts, strict=True)}
    with Flywheel(Sampling("chat"), root=root, block_size=24, batch_size=16, seed=2) as fw:  # style from header
        assert fw.sources[0].style == "padded"
        for step in range(5):
            b = fw.batch(step)
            for x, y, m in zip(b["x"], b["y"], b["padding_mask"], strict=True):
                doc, prompt = by_first[tuple(x[:3].tolist())]
                full = [*doc, 999]  # the document and its end-of-text
                n = min(len(full), 25) - 1
                assert m[:n].all() and not m[n:].any()
                assert x[:n].tolist() == full[:n] and (x[n:] == 999).all()
                expected_y = list(full[1 : n + 1])
                for j in range(min(max(prompt - 1, 0), n)):
                    expected_y[j] = -1
                assert y[:n].tolist() == expected_y and (y[n:] == -1).all()


def test_sampling_declarations() -> None:
    s = Sampling(FineWeb, 1.0, "pmd")
    assert (s.name, s.rate, s.style, s.config()) == ("fineweb", 1.0, "pmd", [FineWeb])
    assert Sampling("python-stdlib").config() == [PythonStdlib]
    assert Sampling("dataset/python-stdlib").name == "python-stdlib"
    assert Sampling("my-corpus").name == "my-corpus" and Sampling("my-corpus").config() == []
    strategy = strategy_of([PythonStdlib, Instructions])
    assert isinstance(strategy, Strategy) and strategy.rates == [0.5, 0.5]
    assert strategy_of([Sampling(FineWeb, 0.5), PythonStdlib, "local"]).rates == [0.5, 0.25, 0.25]
    assert strategy_of(FineWeb).rates == [1.0] and strategy_of(s)[0] is s
    assert strategy_of([Sampling(FineWeb, 0.5), Sampling(PythonStdlib, 0.5)]).config() == [FineWeb, PythonStdlib]


def test_check_model_accepts_fitting_models(root: Path) -> None:
    ramp(root, "ramp")
    with Flywheel("ramp", root=root, block_size=32, batch_size=2) as fw:
        assert fw.vocab_size == VOCAB and fw.eot_id == EOT and fw.tokenizer_spec["kind"] == "test"
        fw.check_model(VOCAB, 32)
        fw.check_model(VOCAB + 64, 1024)
