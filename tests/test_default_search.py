"""The default-choice benchmarks (benchmarks/default_choice.py, benchmarks/default_search/ on benchmarks/cells.py):
inputs refused before any work, runs resumed only under the key of their data, code and params, results files
never half-written, tables rendered from any subset of candidates, finalists and the default chosen by the rules."""

from __future__ import annotations

import json

import pytest

from benchmarks import cells
from benchmarks import default_choice as choice
from benchmarks.default_search import page, protocol, runner
from tests.conftest import REPO


@pytest.mark.parametrize("script", [choice, runner])
def test_bad_inputs_are_refused_before_any_work(script, tmp_path, capsys) -> None:
    workdir = tmp_path / "work"
    assert script.main(["--npz", str(tmp_path / "none.npz"), "--workdir", str(workdir)]) == 2
    assert "--npz" in capsys.readouterr().err and not workdir.exists()  # nothing cloned, nothing trained
    (tmp_path / "broken.npz").write_bytes(b"not an npz")
    assert script.main(["--npz", str(tmp_path / "broken.npz"), "--workdir", str(workdir)]) == 2
    assert "not a readable .npz" in capsys.readouterr().err and not workdir.exists()
    npz = tmp_path / "ok.npz"
    import numpy as np

    np.savez(npz, x=np.zeros((2, 28, 28), np.uint8), y=np.zeros(2, int))
    assert script.main(["--npz", str(npz), "--workdir", str(workdir), "--jobs", "0"]) == 2
    assert "--jobs = 0: allowed: a whole number >= 1" in capsys.readouterr().err
    assert script.main(["--collect-only", "--out", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert "--collect-only: " in err and "does not exist" in err


def test_a_truncated_row_is_not_done_and_results_are_written_whole(tmp_path, capsys) -> None:
    path = tmp_path / "out.csv"
    fields = ["a", "b", "key"]
    cells.write_rows(path, fields, [{"a": 1, "b": 2, "key": "k1"}, {"a": 3, "b": 4, "key": "k2"}])
    path.write_text(path.read_text() + "5,6\n")  # an interrupted write's last line
    assert [r["key"] for r in cells.read_rows(path, fields)] == ["k1", "k2"]
    assert "1 incomplete row(s) dropped" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(cells.BenchmarkError, match="are not this script's"):
        cells.read_rows(path, ["other"])


def stub_workspace(tmp_path, name: str = "ws"):
    """A workspace whose stage-2 runner writes a fixed two-epoch history (no training)."""
    root = tmp_path / name
    (root / "benchmarks").mkdir(parents=True)
    (root / "benchmarks/stage2_epochs.py").write_text(
        "import json, sys\n"
        "path = sys.argv[sys.argv.index('--history') + 1]\n"
        "json.dump([{'epoch': e, 'val/unbiased': 0.5 + e / 10, 'val/worst_group': 0.2, 'test/avg': 0.6,"
        " 'test/unbiased': 0.55, 'test/worst_group': 0.3, 'test/worst_group_n': 20} for e in range(2)],"
        " open(path, 'w'))\n"
        "open(sys.argv[0] + '.calls', 'a').write('x')\n")
    return cells.Workspace(cells.digits_cell(0), root, key="workspace-key")


def test_a_run_is_reused_only_under_its_key(tmp_path) -> None:
    workspace = stub_workspace(tmp_path)
    calls = workspace.path / "benchmarks/stage2_epochs.py.calls"
    first = cells.train(workspace, "cand", {"loss.epsilon": 0.25}, "cluster", threads=1)
    again = cells.train(workspace, "cand", {"loss.epsilon": 0.25}, "cluster", threads=1)
    assert calls.read_text() == "x" and again.key == first.key and again.history == first.history
    assert first.date and first.cpu_seconds >= 0
    other = cells.train(workspace, "cand", {"loss.epsilon": 0.5}, "cluster", threads=1)  # other params: trained
    assert calls.read_text() == "xx" and other.key != first.key
    moved = cells.Workspace(workspace.cell, workspace.path, key="other-data-or-code")
    cells.train(moved, "cand", {"loss.epsilon": 0.5}, "cluster", threads=1)
    assert calls.read_text() == "xxx"


def fake_rows(values: dict[str, list[float]], phase: str, chosen, cpu: dict[str, float],
              worst: dict[str, list[float]] | None = None) -> list[dict[str, str]]:
    """Rows of ``phase`` on ``chosen`` cells: candidate -> per-cell value (fractions), the same for validation and
    test unless the test is scrambled by the caller."""
    rows = []
    for name, per_cell in values.items():
        for i, (cell, value) in enumerate(zip(chosen, per_cell)):
            low = (worst or {}).get(name, [value - 0.3] * len(chosen))[i]
            for rule in protocol.RULES:
                rows.append({"phase": phase, "regime": protocol.regime_of(cell), "data": cell.data,
                             "protocol": cell.protocol, "strength": f"{cell.strength:g}", "palette": cell.palette,
                             "seed": str(cell.seed), "candidate": name, "rule": rule, "epoch": "1", "degenerate": "0",
                             "val_unbiased": str(value), "val_worst": str(low), "test_avg": str(value),
                             "test_unbiased": str(value), "test_worst": str(low), "test_worst_n": "20",
                             "cpu_seconds": str(cpu[name]), "wall_seconds": "1", "threads": "1", "jobs": "2",
                             "rev": "abc", "data_sha": "123", "date": "2026-11-29", "key": f"{name}{cell}"})
    return rows


NOISE = [0.004, -0.003, 0.001, -0.002, 0.003, -0.004, 0.002, 0.0, -0.001, 0.002, -0.002, 0.0] * 4  # sums to 0


def noisy(base: float, chosen, scale: float = 1.0) -> list[float]:
    return [base + scale * NOISE[i] for i in range(len(chosen))]


def test_the_screen_carries_the_top_the_regime_bests_and_the_references() -> None:
    """Step 2: the top CARRY_TOP eligible by the mean of the regime means, each regime's best eligible, the previous
    default, the best on predictions, the best q3m16 on clusters and FairKL; over the cost budget: never a contender."""
    every = protocol.candidates()
    screen = protocol.SCREEN_CELLS
    names = sorted(n for n in every if n != protocol.FAIRKL)
    values = {n: noisy(0.80 + 0.001 * i, screen) for i, n in enumerate(names)}
    costly = "cnc-q3m8-pred-replace-e0.5"
    values[costly] = noisy(0.99, screen)  # the best of all, but 3x FairKL's CPU time
    digits_best = "cnc-q3-cluster-replace-e0"
    values[digits_best] = [0.97 if c.data == "digits" else 0.70 for c in screen]
    values[protocol.FAIRKL] = noisy(0.75, screen)
    cpu = {n: (90.0 if n == costly else 50.0) for n in every}
    cpu[protocol.FAIRKL] = 30.0
    rows = fake_rows(values, "screen", screen, cpu)
    carried = protocol.carried(rows, every)
    assert costly not in carried
    ranked = sorted((n for n in names if n != costly and n != digits_best), key=lambda n: -values[n][0])
    assert carried[:protocol.CARRY_TOP] == ranked[:protocol.CARRY_TOP]
    assert digits_best in carried and protocol.PREVIOUS in carried and carried[-1] == protocol.FAIRKL
    assert any("-pred-" in n for n in carried) and any(n.startswith("cnc-q3m16-cluster-") for n in carried)


def test_the_confirmation_is_sized_from_the_screens_paired_sd() -> None:
    """Step 3: enough cells to detect DETECT points and to show ±MARGIN at 80 % power, between FLOOR and CAP; more
    spread, more cells."""
    from debias.metrics.paired import seeds_needed

    screen = protocol.SCREEN_CELLS
    a, b = "cnc-q3-cluster-shrink-e0", "cnc-q3m16-cluster-shrink-e0"
    spread = {"digits": 0.03, "cmnist": 0.01, "bmnist": 0.002}
    values = {a: [0.9] * len(screen),
              b: [0.9 + spread[protocol.regime_of(c)] * (1 if i % 2 else -1) for i, c in enumerate(screen)]}
    rows = fake_rows(values, "screen", screen, {a: 1.0, b: 1.0})
    found = protocol.sizes(rows, [a, b])
    for regime, sizing in found.items():
        diffs = [100 * spread[regime] * (1 if i % 2 else -1) for i, c in enumerate(screen)
                 if protocol.regime_of(c) == regime]
        import statistics
        assert sizing.sd == pytest.approx(statistics.stdev(diffs))
        wanted = max(seeds_needed(sizing.sd, delta=protocol.DETECT), seeds_needed(sizing.sd, margin=protocol.MARGIN))
        assert sizing.cells == min(protocol.CAP[regime], max(protocol.FLOOR[regime], wanted))
    assert found["digits"].cells == protocol.CAP["digits"] and found["bmnist"].cells == protocol.FLOOR["bmnist"]
    assert found["cmnist"].equivalence > found["bmnist"].equivalence


def confirmation(values: dict[str, dict[str, float]], cpu: dict[str, float], n: int = 12,
                 worst: dict[str, float] | None = None) -> list[dict[str, str]]:
    """Confirmation rows: candidate -> regime -> mean (fractions), n cells a regime, small paired noise."""
    chosen = protocol.confirm_cells({r: n for r in protocol.REGIMES})  # n cells a regime, in regime order
    per_cell = {name: [means[protocol.regime_of(c)] + 0.5 * NOISE[i % n] * (1 + j % 3)
                       for i, c in enumerate(chosen)] for j, (name, means) in enumerate(values.items())}
    lows = {name: [v - (worst or {}).get(name, 0.3) for v in per_cell[name]] for name in values}
    return fake_rows(per_cell, "confirm", chosen, cpu, lows)


def test_the_default_holds_every_regime_and_the_cheapest_such_wins() -> None:
    """Step 4: the winner per regime; a cheaper candidate replaces it only where shown equivalent (TOST ±1) in every
    regime; one shown worse than a carried candidate does not qualify."""
    best, cheap_twin, cheap_worse = "cnc-q3m16-cluster-shrink-e0", "cnc-q3-cluster-shrink-e0", "cnc-q3-pred-shrink-e0"
    values = {best: {"digits": 0.92, "cmnist": 0.94, "bmnist": 0.93},
              cheap_twin: {"digits": 0.9198, "cmnist": 0.9398, "bmnist": 0.9299},  # within 0.02 points
              cheap_worse: {"digits": 0.88, "cmnist": 0.9399, "bmnist": 0.93},  # 4 points behind on digits
              protocol.FAIRKL: {"digits": 0.86, "cmnist": 0.90, "bmnist": 0.89}}
    cpu = {best: 60.0, cheap_twin: 40.0, cheap_worse: 30.0, protocol.FAIRKL: 35.0}
    rows = confirmation(values, cpu)
    decision = protocol.decide(*protocol.validation_only(rows, "confirm"), list(values))
    assert decision.winners == {"digits": best, "cmnist": best, "bmnist": best}
    assert decision.holds[cheap_twin]["digits"].startswith("equivalent") and decision.held_everywhere
    assert decision.default == cheap_twin  # equivalent everywhere and cheaper
    assert not decision.holds[cheap_worse]["digits"] and decision.worse[cheap_worse]
    # without the equivalent twin, the winner itself
    del values[cheap_twin]
    rows = confirmation(values, cpu)
    assert protocol.decide(*protocol.validation_only(rows, "confirm"), list(values)).default == best
    # over the cost budget: not a contender, whatever its numbers
    rows = confirmation(values, {**cpu, best: 80.0})
    decision = protocol.decide(*protocol.validation_only(rows, "confirm"), list(values))
    assert best not in decision.contenders and decision.default != best


def test_shown_worse_on_worst_group_disqualifies() -> None:
    best, rival = "cnc-q3m16-cluster-shrink-e0", "cnc-q3m16-pred-shrink-e0"
    values = {best: {"digits": 0.92, "cmnist": 0.94, "bmnist": 0.93},
              rival: {"digits": 0.9199, "cmnist": 0.9399, "bmnist": 0.9299}}
    cpu = {best: 50.0, rival: 50.0, protocol.FAIRKL: 40.0}
    values[protocol.FAIRKL] = {"digits": 0.8, "cmnist": 0.8, "bmnist": 0.8}
    rows = confirmation(values, cpu, worst={best: 0.40, rival: 0.30, protocol.FAIRKL: 0.5})  # best 10 points behind
    decision = protocol.decide(*protocol.validation_only(rows, "confirm"), list(values))
    assert any("worst-group below" in w for w in decision.worse[best])
    assert decision.default == rival


def test_no_single_default_falls_back_to_the_digits_holder_and_says_so() -> None:
    digits_best, mnist_best = "cnc-q3m8-cluster-shrink-e0", "cnc-q3-cluster-shrink-e0"
    values = {digits_best: {"digits": 0.92, "cmnist": 0.90, "bmnist": 0.90},
              mnist_best: {"digits": 0.85, "cmnist": 0.95, "bmnist": 0.95},
              protocol.FAIRKL: {"digits": 0.80, "cmnist": 0.80, "bmnist": 0.80}}
    cpu = {digits_best: 50.0, mnist_best: 50.0, protocol.FAIRKL: 40.0}
    rows = confirmation(values, cpu)
    decision = protocol.decide(*protocol.validation_only(rows, "confirm"), list(values))
    assert not decision.held_everywhere and decision.default == digits_best
    assert "not: cmnist, bmnist" in decision.notes[0]


def test_the_decision_reads_no_test_column() -> None:
    """decide() gets the confirmation rows with their test columns removed: scrambled or missing test numbers cannot
    change the default, and a decision that tried to read one would fail."""
    best, other = "cnc-q3m16-cluster-shrink-e0", "cnc-q3-cluster-shrink-e0"
    values = {best: {"digits": 0.92, "cmnist": 0.94, "bmnist": 0.93},
              other: {"digits": 0.90, "cmnist": 0.92, "bmnist": 0.91},
              protocol.FAIRKL: {"digits": 0.86, "cmnist": 0.90, "bmnist": 0.89}}
    cpu = {best: 50.0, other: 40.0, protocol.FAIRKL: 35.0}
    rows = confirmation(values, cpu)
    tables = protocol.validation_only(rows, "confirm")
    first = protocol.decide(*tables, list(values))
    scrambled = [{**row, "test_unbiased": "1.0" if row["candidate"] == other else "0.0", "test_worst": "0.0"}
                 for row in rows]
    again = protocol.decide(*protocol.validation_only(scrambled, "confirm"), list(values))
    assert again.default == first.default == best
    import inspect

    source = inspect.getsource(protocol.decide)
    assert not any(field in source for field in protocol.TEST_FIELDS)  # the function names no test column
    blind_rows = [{k: v for k, v in row.items() if k not in protocol.TEST_FIELDS} for row in rows]
    assert protocol.decide(*protocol.validation_only(blind_rows, "confirm"), list(values)).default == best


def test_the_page_renders_every_phase_with_its_protocol_and_what_rows_were_made_with() -> None:
    every = protocol.candidates()
    screen = protocol.SCREEN_CELLS
    names = sorted(every)
    cpu = {n: 40.0 for n in every}
    rows = fake_rows({n: noisy(0.8 + 0.001 * i, screen) for i, n in enumerate(names)}, "screen", screen, cpu)
    carried = protocol.carried(rows, every)
    rows += confirmation({n: {r: 0.9 - 0.001 * i for r in protocol.REGIMES} for i, n in enumerate(carried)}, cpu)
    held = [c for c in protocol.HELDOUT_CELLS]
    rows += fake_rows({n: noisy(0.9 - 0.001 * i, held, 2.0) for i, n in enumerate(carried)}, "heldout", held, cpu)
    text = page.markdown(rows, every, "python -m benchmarks.default_search ...", commit="abc1234 2026-11-29")
    assert "## Protocol" in text and protocol.PROTOCOL in text and "commit abc1234 2026-11-29" in text
    assert "torch threads per run: 1; runs at once: 2; code and params.yaml of commit abc" in text
    for heading in ("## 1. Screen", "## 2. Confirmation size", "## 3. Confirmation and decision",
                    "### Decision", "## 4. Held-out cells", "### bmnist0.98", "### Palettes no search saw",
                    "### Selection rules on the same held-out runs"):
        assert heading in text
    assert "**The default: " in text


def test_rows_made_with_other_settings_say_so_in_the_header() -> None:
    screen = protocol.SCREEN_CELLS[:1]
    rows = fake_rows({"a": [0.9]}, "screen", screen, {"a": 1.0})
    other = [{**row, "threads": "4", "jobs": "8", "key": "other"} for row in rows]
    assert "torch threads per run: 1 / 4; runs at once: 2 / 8" in cells.made_with(rows + other)


def test_a_run_given_by_two_rows_is_refused_naming_the_rows_never_decided_by_the_later(tmp_path, capsys) -> None:
    """A CSV holding one run twice (a stale run under another thread count beside its rerun) must not render a page
    whose numbers are whichever row came last: the page is refused, naming both rows and what differs."""
    every = protocol.candidates()
    screen = protocol.SCREEN_CELLS
    rows = fake_rows({n: noisy(0.8 + 0.001 * i, screen) for i, n in enumerate(sorted(every))}, "screen", screen,
                     {n: 40.0 for n in every})
    first = rows[0]
    assert protocol.duplicate_runs(rows) == []
    stale = {**first, "val_unbiased": "0.1", "threads": "4", "key": "stale"}
    with pytest.raises(cells.BenchmarkError, match="1 run\\(s\\) given by more than one row") as refused:
        page.markdown(rows + [stale], every, "cmd")
    message = str(refused.value)
    run = f"screen {protocol.cell_of(first).name} {first['candidate']} {first['rule']}"
    assert f"rows 1, {len(rows) + 1} ({run}; " in message
    assert "threads 1 / 4" in message and " / stale)" in message
    out = tmp_path / "results"
    cells.write_rows(out.with_suffix(".csv"), protocol.FIELDS, rows + [stale])
    assert runner.main(["--collect-only", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 1 run(s) given by more than one row") and f"rows 1, {len(rows) + 1}" in err
    assert not out.with_suffix(".md").exists()  # no page written from the mixed rows


def test_a_header_only_csv_is_refused_in_one_line(tmp_path, capsys) -> None:
    out = tmp_path / "results"
    cells.write_rows(out.with_suffix(".csv"), protocol.FIELDS, [])
    assert runner.main(["--collect-only", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no complete row" in err


def test_mnist10k_halves_are_disjoint_stratified_and_stable(tmp_path) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (200, 28, 28), dtype=np.uint8)
    x[:, 0, 0], x[:, 0, 1] = np.arange(200) % 256, np.arange(200) // 256  # each image tagged with its index
    y = np.repeat(np.arange(10), 20)
    source = tmp_path / "m.npz"
    np.savez(source, x=x, y=y)
    halves = cells.write_halves(source, tmp_path / "work")
    tags = {}
    for half, path in halves.items():
        with np.load(path) as archive:
            tags[half] = set((archive["x"][:, 0, 0].astype(int) + 256 * archive["x"][:, 0, 1].astype(int)).tolist())
            assert np.bincount(archive["y"]).tolist() == [10] * 10
    assert not tags["A"] & tags["B"] and len(tags["A"] | tags["B"]) == 200
    before = halves["A"].read_bytes()
    assert cells.write_halves(source, tmp_path / "work")["A"].read_bytes() == before
    other = cells.write_halves(source, tmp_path / "again")
    assert other["A"].read_bytes() == before  # the same permutation on any machine


def test_a_cell_names_its_strength_and_palette_and_sets_them() -> None:
    cell = cells.Cell("mnist10k-B", "bmnist", "fresh", 101, 0.98)
    assert cell.name == "mnist10k-B-bmnist0.98-fresh-s101" and cell.half == "B"
    tree = cell.overrides(None)
    assert tree["bias"]["protocol"] == "background" and tree["bias"]["background"]["rho"] == 0.98
    assert tree["bias"]["background"]["colours"] == cells.PALETTES["fresh"]["bias"]["background"]["colours"]
    assert cells.Cell("mnist10k", "cmnist", "paper", 0).name == "mnist10k-cmnist-paper-s0"
    assert protocol.regime_of(cell) == "bmnist0.98" and protocol.regime_of(cells.digits_cell(3)) == "digits"


def test_the_objective_table_renders_without_cnc_among_the_candidates() -> None:
    """A run of a subset of candidates (no cnc) renders its tables (it crashed on an empty mean)."""
    chosen = [cells.Cell("mnist10k", "cmnist", "paper", s) for s in (0, 1, 2)]
    rows = []
    for name, base in (("kl_a1_l05", 0.8), ("released_a003_l05", 0.85)):
        for i, cell in enumerate(chosen):
            for rule in choice.RULES:
                rows.append({"protocol": cell.protocol, "palette": cell.palette, "seed": str(cell.seed),
                             "candidate": name, "rule": rule, "epoch": "3", "degenerate": "0", "val_worst": "0.4",
                             "val_unbiased": "0.8", "test_avg": "0.8", "test_unbiased": str(base + 0.01 * i),
                             "test_worst": str(base - 0.4 + 0.02 * i), "test_worst_n": "40", "cpu_seconds": "30",
                             "wall_seconds": "31", "date": "2026-11-28", "key": f"{name}{i}"})
    text = choice.table(rows, "python -m benchmarks.default_choice ...")
    assert "Chosen under `best_unbiased`" in text and "## Stage-2 cost: CPU seconds" in text
    assert "- Runs: 2026-11-28; written" in text
    assert json.dumps(choice.candidate_sets("kl_a1_l05"))  # every candidate's params are JSON (they key its runs)


def test_a_rendered_header_says_what_the_rows_were_made_with_not_the_command(tmp_path) -> None:
    """--collect-only --threads 4 --jobs 8 must not relabel rows made with 1 thread and 2 runs at once."""
    out = tmp_path / "choice"
    row = {field: "1" for field in choice.FIELDS}
    row.update({"protocol": "cmnist", "palette": "paper", "seed": "0", "candidate": "cnc",
                "val_worst": "0.5", "val_unbiased": "0.8", "test_avg": "0.8", "test_unbiased": "0.8",
                "test_worst": "0.5", "test_worst_n": "40", "threads": "1", "jobs": "2", "rev": "abc123",
                "data_sha": "fe03", "date": "2026-11-29", "key": "k"})
    rows = [{**row, "rule": rule} for rule in choice.RULES]
    cells.write_rows(out.with_suffix(".csv"), choice.FIELDS, rows)
    assert choice.main(["--collect-only", "--threads", "4", "--jobs", "8", "--out", str(out)]) == 0
    made = next(line for line in out.with_suffix(".md").read_text().splitlines() if "rows made with" in line)
    assert "torch threads per run: 1; runs at once: 2; code and params.yaml of commit abc123" in made
    assert "SHA-256 fe03" in made and "4" not in made.split("rows made with")[1].replace("x86_64", "")
    cells.write_rows(out.with_suffix(".csv"), choice.FIELDS, [])
    assert choice.main(["--collect-only", "--out", str(out)]) == 2  # a header alone says nothing: refused


def test_the_thread_count_is_part_of_every_key(tmp_path) -> None:
    """A resume at another --threads reuses no upstream and no run (their CPU seconds decide eligibility)."""
    cell = cells.digits_cell(0)
    one = cells.workspace_key(cell, None, "HEAD", 1, "digits")
    four = cells.workspace_key(cell, None, "HEAD", 4, "digits")
    assert one != four
    sets = {"loss.epsilon": 0.0}
    assert (cells.run_key(cells.Workspace(cell, tmp_path, one), "cluster", sets)
            != cells.run_key(cells.Workspace(cell, tmp_path, four), "cluster", sets))


# The settings a candidate's stage 2 reads, by method: every one must be pinned by the candidate itself, so a candidate
# means the same whatever params.yaml's defaults become.
SCHEDULE_KEYS = ("stage2.method", "stage2.optimizer", "stage2.lr", "stage2.weight_decay", "stage2.epochs",
                 "stage2.lr_milestones", "stage2.augment_shift", "stage2.selection", "loss.epsilon")
READ_BY = {"cnc": SCHEDULE_KEYS + tuple(f"stage2.cnc.{k}" for k in (
               "num_positives", "num_negatives", "two_sided", "temperature", "anchor_fraction", "accumulation",
               "contrastive_weight", "init", "skip_empty_classes", "short_pools", "encoder_mode", "head_gradient")),
           "eps_supinfonce": SCHEDULE_KEYS + ("stage2.batch_size", "loss.temperature", "loss.alpha",
                                              "loss.fairkl.variant", "loss.fairkl.weight", "loss.fairkl.sampler")}


def test_every_benchmark_candidate_pins_what_it_means() -> None:
    found = {f"choice:{name}": choice.candidate_sets(name) for name in choice.CANDIDATES}
    found.update({f"search:{name}": c.sets for name, c in protocol.candidates().items()})
    for label, sets in found.items():
        missing = [key for key in READ_BY[sets["stage2.method"]] if key not in sets]
        assert not missing, f"{label} inherits {missing} from params.yaml"
    assert choice.candidate_sets("cnc")["loss.epsilon"] == 0.0  # CNC read no margin when the table was made


def test_the_speed_benchmarks_cnc_row_times_the_authors_loss() -> None:
    """The authors'-code baseline computes CNC's loss without a margin: the timed row must too."""
    import yaml

    from debias.core.trees import merge

    spec = yaml.safe_load((REPO / "benchmarks/speed.yaml").read_text())["throughput"]
    resolved = merge(spec["base"], spec["methods"]["cnc"])
    assert resolved["loss"]["epsilon"] == 0.0 and resolved["stage2"]["method"] == "cnc"


def extension_case(default_bmnist: float, winner_bmnist: float) -> tuple[list[dict[str, str]], list[str]]:
    """Confirmation rows where the default (digits and cmnist winner) trails bmnist's winner by a little, neither
    shown worse nor shown equivalent over 12 noisy cells."""
    default, winner = "cnc-q3m8-cluster-replace-e0", "cnc-q3m8-pred-shrink-e0"
    values = {default: {"digits": 0.92, "cmnist": 0.94, "bmnist": default_bmnist},
              winner: {"digits": 0.88, "cmnist": 0.90, "bmnist": winner_bmnist},
              protocol.FAIRKL: {"digits": 0.80, "cmnist": 0.80, "bmnist": 0.80}}
    chosen = protocol.confirm_cells({r: 12 for r in protocol.REGIMES})
    swing = [0.04, -0.04, 0.03, -0.03, 0.02, -0.02, 0.04, -0.04, 0.01, -0.01, 0.0, 0.0]  # paired sd ~2.8 points
    per_cell = {name: [means[protocol.regime_of(c)] + (swing[i % 12] if name == default and protocol.regime_of(c) ==
                                                     "bmnist" else 0.001 * NOISE[i % 12]) for i, c in enumerate(chosen)]
                for name, means in values.items()}
    cpu = {default: 50.0, winner: 50.0, protocol.FAIRKL: 40.0}
    return fake_rows(per_cell, "confirm", chosen, cpu), list(values)


def test_the_extension_pairs_the_default_with_the_regime_it_missed_sized_for_equivalence() -> None:
    """Step 7's plan: only the regime the default neither wins nor is equivalent in, against that regime's winner,
    with the cells TOST ±MARGIN needs at 80 % power from the two's paired sd over the confirmation, capped."""
    from debias.metrics.paired import paired, seeds_needed

    rows, names = extension_case(0.925, 0.93)
    val_u, val_w, cpu = protocol.validation_only(rows, "confirm")
    decision = protocol.decide(val_u, val_w, cpu, names)
    assert decision.default == names[0] and not decision.holds[names[0]]["bmnist"]
    (plan,) = protocol.extension_plan(decision, val_u)
    assert (plan.regime, plan.default, plan.rival) == ("bmnist", names[0], names[1])
    sd = paired(protocol.differences(val_u["bmnist"], names[0], names[1])).sd
    assert plan.sd == pytest.approx(sd) and plan.cells == min(protocol.EXTENSION_CAP, seeds_needed(sd, margin=protocol.MARGIN))
    assert plan.chosen()[0] == cells.Cell("mnist10k-A", "bmnist", "paper", protocol.EXTENSION_SEED)
    assert not set(plan.chosen()) & set(protocol.confirm_cells({r: 40 for r in protocol.REGIMES}))  # fresh cells
    # a default shown worse there is not extended: that is a verdict already
    rows, names = extension_case(0.85, 0.93)
    val_u, val_w, cpu = protocol.validation_only(rows, "confirm")
    decision = protocol.decide(val_u, val_w, cpu, names)
    assert decision.default == names[0] and protocol.extension_plan(decision, val_u) == []


def extension_rows(plan, default: list[float], rival: list[float], worst_gap: float = 0.0) -> list[dict[str, str]]:
    chosen = plan.chosen()
    worst = {plan.default: [v - 0.3 - worst_gap * (1 + 50 * NOISE[i % len(NOISE)]) for i, v in enumerate(default)],
             plan.rival: [v - 0.3 for v in rival]}
    return fake_rows({plan.default: default, plan.rival: rival}, "extension", chosen,
                     {plan.default: 1.0, plan.rival: 1.0}, worst)


def test_the_extension_verdict_is_step_4s_rule_on_its_own_cells_and_reads_no_test_column() -> None:
    plan = protocol.Extension("bmnist", "cnc-q3m8-cluster-replace-e0", "cnc-q3m8-pred-shrink-e0", 3.0, 12)
    rival = [0.90 + 0.01 * NOISE[i] for i in range(12)]

    def verdict(default: list[float], worst_gap: float = 0.0, drop: int = 0) -> protocol.Verdict:
        rows = extension_rows(plan, default, rival, worst_gap)
        rows = [r for r in rows if not (r["candidate"] == plan.default and int(r["seed"]) < protocol.EXTENSION_SEED + drop)]
        scrambled = [{**r, "test_unbiased": "0.0", "test_worst": "0.0"} for r in rows]
        u, w, _ = protocol.validation_only(scrambled, "extension")
        found = protocol.decide_extension(u, w, plan)
        blind = protocol.validation_only([{k: v for k, v in r.items() if k not in protocol.TEST_FIELDS} for r in rows],
                                       "extension")
        assert protocol.decide_extension(blind[0], blind[1], plan) == found
        return found

    assert verdict([v + 0.002 for v in rival]).holds == "winner"  # ahead on the fresh cells
    near = verdict([v - 0.002 + 3.5 * NOISE[i] for i, v in enumerate(rival)])  # Δ -0.2, sd ~0.9 points
    assert near.holds.startswith("equivalent") and near.p_equivalent < 0.05 and not near.unbiased.excludes_zero
    assert verdict([v - 0.009 + 0.3 * NOISE[i] for i, v in enumerate(rival)]).holds == ""  # behind, too noisy to tell
    worse = verdict([v + 0.002 for v in rival], worst_gap=0.05)
    assert worse.holds == "" and worse.shown_worse == ["worst-group"]
    assert verdict([v + 0.002 for v in rival], drop=2).holds == ""  # cells missing: no verdict
    import inspect

    assert not any(f in inspect.getsource(protocol.decide_extension) for f in protocol.TEST_FIELDS)


def test_the_page_shows_the_extension_and_its_verdict() -> None:
    rows, names = extension_case(0.925, 0.93)
    val_u, val_w, cpu = protocol.validation_only(rows, "confirm")
    (plan,) = protocol.extension_plan(protocol.decide(val_u, val_w, cpu, names), val_u)
    every = protocol.candidates()
    screen = fake_rows({n: noisy(0.9 if n in names else 0.5, protocol.SCREEN_CELLS) for n in every}, "screen",
                       protocol.SCREEN_CELLS, {n: 40.0 for n in every})
    base = screen + rows
    text = page.markdown(base, every, "cmd", commit="a 2026", extension_commit="b 2026")
    assert protocol.EXTENSION_PROTOCOL in text and "step 7 at commit b 2026" in text
    assert "## 3b. Extension" in text and "not yet: cells missing" in text and "no verdict" in text
    rival = [0.93 + 0.01 * NOISE[i % len(NOISE)] for i in range(plan.cells)]
    text = page.markdown(base + extension_rows(plan, [v + 0.001 for v in rival], rival), every, "cmd")
    assert f"**After the extension, {plan.default} holds every regime.**" in text
    assert "step 8 at commit" not in text  # no candidate was ahead of the default: step 8 ran nothing
    text = page.markdown(base + extension_rows(plan, [v - 0.05 for v in rival], rival), every, "cmd")
    assert f"no single setting holds every regime: {plan.default} does not hold bmnist" in text


def test_the_extension_counts_first_epochs_kept_and_what_the_last_epoch_did() -> None:
    plan = protocol.Extension("bmnist", "cnc-q3m8-cluster-replace-e0", "cnc-q3m8-pred-shrink-e0", 3.0, 4)
    rows = extension_rows(plan, [0.90, 0.91, 0.92, 0.93], [0.90, 0.90, 0.90, 0.90])
    for row in rows:
        if row["candidate"] == plan.default and row["seed"] in ("200", "201"):
            if row["rule"] == protocol.RANKED_RULE:
                row["degenerate"] = "1"
            if row["rule"] == "last":
                row["val_unbiased"] = str(float(row["val_unbiased"]) - 0.03 - 0.01 * (row["seed"] == "201"))
    text = "\n".join(page.first_epochs(rows, "extension"))
    assert f"| bmnist | {plan.default} | 2 of 4 | -1.8 [" in text  # -3, -4, 0, 0 points: mean -1.75
    assert f"| bmnist | {plan.rival} | 0 of 4 | +0.0" in text


def test_step_8_reports_the_candidates_ahead_of_the_default_on_the_same_cells_without_a_verdict() -> None:
    rows, names = extension_case(0.925, 0.93)
    ahead, behind = "cnc-q3m16-cluster-replace-e0", "cnc-q3-cluster-shrink-e0"
    chosen = protocol.confirm_cells({r: 12 for r in protocol.REGIMES})
    means = {ahead: {"digits": 0.85, "cmnist": 0.85, "bmnist": 0.928}, behind: {"digits": 0.85, "cmnist": 0.85,
                                                                              "bmnist": 0.90}}
    rows += fake_rows({n: [m[protocol.regime_of(c)] + 0.001 * NOISE[i % 12] for i, c in enumerate(chosen)]
                       for n, m in means.items()}, "confirm", chosen, {ahead: 50.0, behind: 50.0})
    val_u, val_w, cpu = protocol.validation_only(rows, "confirm")
    decision = protocol.decide(val_u, val_w, cpu, names + [ahead, behind])
    (plan,) = protocol.extension_plan(decision, val_u)
    assert plan.others == (ahead,) and plan.rival == names[1]  # ahead of the default there; not the one behind
    base = [0.90 + 0.01 * NOISE[i % len(NOISE)] for i in range(plan.cells)]
    fresh = extension_rows(plan, [v + 0.001 for v in base], base)
    fresh += fake_rows({ahead: [v + 0.02 + 0.01 * NOISE[(i + 3) % len(NOISE)] for i, v in enumerate(base)]},
                       "extension", plan.chosen(), {ahead: 1.0})
    u, w, _ = protocol.validation_only(fresh, "extension")
    text = "\n".join(page.report_only(u, w, [plan]))
    assert f"| bmnist | {ahead} | {plan.cells} | " in text and "| -1.9 [" in text  # the default 1.9 points behind
    assert protocol.decide_extension(u, w, plan).holds == "winner"  # step 8 changes no verdict
