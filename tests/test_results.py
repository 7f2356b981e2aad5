"""The README's results table is the one generated from the saved quality runs."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from surgeon.config import PruneConfig

ROOT = Path(__file__).resolve().parents[1]


def test_readme_results_table_matches_the_quality_runs():
    result = subprocess.run([sys.executable, "-m", "bench.results_md", "--check"], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_bench_runs_as_a_package_without_editing_the_import_path():
    assert [str(path) for path in (ROOT / "bench").rglob("*.py") if "sys.path" in path.read_text()] == []
    result = subprocess.run([sys.executable, "-m", "bench.quality.table", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("usage:"), result.stderr


def test_any_table_runs_the_default_rows_baselines_and_its_own_rows_by_name():
    sys.path.insert(0, str(ROOT))
    from bench.quality.table import runnable_rows

    named = runnable_rows(shots_structured=4, shots_element=4)
    refine = named["unstructured-0.5-sparsegpt-refine"]  # a baseline of the default rows, on SmolLM2's table too
    assert (refine.method, refine.shots, named["2of4-0.5-sparsegpt-refine"].structure) == ("sparsegpt-refine", 1, "2:4")
    assert named["unstructured-0.5-surgeon-alone"].held_out_choice is False
    assert named["unstructured-0.5-surgeon"].shots == 4  # an id of both keeps SmolLM2's table's settings
    assert named["2of4-0.5-surgeon-alone-sampled"].fisher == "sampled"


def test_results_go_stale_when_code_changes_but_not_its_docstrings_or_comments():
    sys.path.insert(0, str(ROOT))
    from bench.provenance import code_of

    module = '"""Module."""\n\ndef f(x):\n    """Doc."""\n    return x + 1  # one\n'
    assert code_of(module) == code_of(module.replace("Doc.", "Other doc.").replace("# one", "# two"))
    assert code_of(module) == code_of(module.replace('    """Doc."""\n', ""))
    assert code_of(module) != code_of(module.replace("x + 1", "x + 2"))
    assert code_of(module) != code_of(module.replace('    """Doc."""\n', '    "Doc."\n    "More."\n'))


def test_runs_at_commits_that_change_only_benchmarks_or_documents_form_one_set():
    sys.path.insert(0, str(ROOT))
    from bench.provenance import git, same_code

    if git("cat-file", "-e", "a49198b^{commit}").returncode != 0:
        pytest.skip("needs the repository's history")
    assert same_code("64461c4", "94ac23f")  # between them: result files, RESULTS, README and DESIGN
    assert not same_code("a49198b", "64461c4")  # between them: surgeon/config.py's code


def test_a_table_resumes_a_row_saved_at_a_commit_that_runs_the_same_code(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench.provenance import git
    from bench.quality.table import measured

    if git("cat-file", "-e", "a49198b^{commit}").returncode != 0:
        pytest.skip("needs the repository's history")
    here, there = "AMD EPYC", "Intel Xeon"
    assert not measured(tmp_path / "dense@94ac23f.json", here)
    (tmp_path / "dense@64461c4.json").write_text('{"ppl": 1, "machine": "AMD EPYC"}')
    (tmp_path / "dense@a49198b.json").write_text('{"ppl": 2, "machine": "AMD EPYC"}')
    assert measured(tmp_path / "dense@94ac23f.json", here)  # only benchmarks and documents changed since 64461c4
    assert not measured(tmp_path / "dense@94ac23f.json", there)  # its seconds would be another machine's
    assert not measured(tmp_path / "other@94ac23f.json", here)
    (tmp_path / "dense@64461c4.json").unlink()
    assert not measured(tmp_path / "dense@94ac23f.json", here)  # a49198b's pruning code differs
    (tmp_path / "other@0000000.json").write_text('{"ppl": 3}')
    assert measured(tmp_path / "other@0000000.json", here)  # saved at this very commit, though git knows none such


def test_a_table_shows_each_rows_newest_run_and_names_its_commit(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT))

    from bench import provenance, results_md, section

    if provenance.git("cat-file", "-e", "5768318^{commit}").returncode != 0:
        pytest.skip("needs the repository's history")
    config = dict(structure="unstructured", target_size=0.5, method="wanda", shots=1, damp_g=0.1, damp_a=0.01)
    saved = {"64461c4": "dense a", "5768318": "a b", "333f22a": "dense", "0000000": "c"}  # oldest first; c: no commit
    (tmp_path / "quality").mkdir()
    for commit, rows in saved.items():
        for row in rows.split():
            (tmp_path / "quality" / f"{row}@{commit}.json").write_text(json.dumps(
                dict(ppl=float(len(row)), seconds=1, sparsity=0.5, config=config)))
    monkeypatch.setattr(provenance, "RESULTS", tmp_path)
    runs = provenance.newest_runs("quality")
    assert {row: run["commit"] for row, run in runs.items()} == {"a": "5768318", "b": "5768318", "dense": "333f22a"}
    table = results_md.quality_table(runs).splitlines()
    assert table[2].startswith("| dense |") and table[3].startswith("| a |") and table[4].startswith("| b |")
    assert all(line.endswith(" | `5768318` (stale) |") for line in table[3:])  # the code changed since
    rows = section.Section("quality/*@*.json", "row | ppl", lambda path, run: [(provenance.row_of(path), run["ppl"])],
                           newest="row")
    assert rows()[2:] == ["| a | 1.0 |", "| b | 1.0 |", "| dense | 5.0 |"]  # each row once, as of its newest commit


def test_cpu_runs_do_not_go_stale_when_only_a_triton_kernel_changes():
    sys.path.insert(0, str(ROOT))
    from bench.provenance import CPU_PRUNING, PRUNING, code_changed, git

    if git("cat-file", "-e", "6f3412a^{commit}").returncode != 0:
        pytest.skip("needs the repository's history")
    assert code_changed("6f3412a~1", "6f3412a", PRUNING)  # kfac_accumulate's Triton kernel alone
    assert not code_changed("6f3412a~1", "6f3412a", CPU_PRUNING)
    assert code_changed("2620b43~1", "2620b43", CPU_PRUNING)  # that kernel and surgeon's curvature pass


def test_the_headline_quotes_the_defaults_with_a_second_decimal_only_where_one_would_print_a_tie():
    sys.path.insert(0, str(ROOT))
    from bench.results_md import headline_cells

    def run(ppl: float, structure: str, **settings) -> dict:
        config = PruneConfig(structure=structure, target_size=None if ":" in structure else 0.5, **settings)
        return {"ppl": ppl, "config": config.resolved()}

    runs = {"unstructured-0.5-sparsegpt": run(39.694, "unstructured", method="sparsegpt", shots=1),
            "unstructured-0.5-surgeon": run(31.295, "unstructured", shots=4),  # more shots than the CLI's 2
            "unstructured-0.5-surgeon-shots2": run(39.662, "unstructured"),
            "2of4-0.5-wanda": run(74.68, "2:4", method="wanda"), "2of4-0.5-surgeon": run(64.31, "2:4"),
            "4of8-0.5-wanda": run(80.0, "4:8", method="wanda"), "4of8-0.5-surgeon": run(60.0, "4:8", damp_g=0.1)}
    assert headline_cells(runs, "unstructured-0.5") == (
        "SparseGPT 39.69 | **39.66**", ["unstructured-0.5-sparsegpt", "unstructured-0.5-surgeon-shots2"])
    assert headline_cells(runs, "2of4-0.5")[0] == "Wanda 74.7 | **64.3**"
    assert headline_cells(runs, "4of8-0.5") == ("- | -", [])  # LLM Surgeon's run is not the defaults


def test_the_quick_gpu_measurement_fits_nine_and_a_half_minutes_by_its_own_count():
    """The time limits of `bench/timing/measure_gpu.sh --quick`'s steps, which end each one, sum to at most 9.5 min:
    one command of at most 10 minutes runs it all."""
    script = (ROOT / "bench" / "timing" / "measure_gpu.sh").read_text()
    quick = script[script.index('if [ "${1:-}" = --quick ]'):script.index("exit 0")]
    limits = [int(word) for line in quick.splitlines() for before, word in zip(line.split(), line.split()[1:])
              if before in ("quick", "timeout") and word.isdigit()]
    assert len(limits) == 6 and sum(limits) <= 9.5 * 60, limits


# A measured figure a document quotes: a decimal (31.92, 66.6 GiB, 0.82×) or a whole number of seconds, minutes, GiB
# or times (371 s, 5×). Not figures: settings and counts without those units (80%, 2:4, 128 × 2048, 35 options, ICLR
# 2024), numbers inside names (Qwen1.5, A2.7B, 8x7B), versions (torch 2.13.0, vLLM 0.32, transformers 5.15–5.17),
# section numbers (sec. 3.4), damping settings (λ_G = 0.01), and whatever stands in code: fenced blocks, inline code
# (`--target-size 0.8`) and link targets.
FENCED = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
GENERATED = re.compile(r"<!-- results-table:start -->.*?<!-- results-table:end -->", re.S)
VERSION = re.compile(r"(?<![\w.])\d+(?:\.\d+){2,}(?:\+\w+)?")
NAMED_SETTING = re.compile(r"(?:\b(?:vLLM|torch|transformers|llm-compressor|Python|Triton|CUDA|BY-SA|sec|eqs?)\.?"
                           r"|λ_\w+ ?=) ?\d+(?:\.\d+)?(?: ?[–-] ?\d+(?:\.\d+)?)?")
UNIT = r"(?: ?(?:ms|min|s|GiB|GB)(?!\w)|[×x%](?!\w))"
FIGURE = re.compile(rf"(?<![\w.])(?P<number>\d+\.\d+|\d+(?= ?(?:ms|min|s|GiB)(?!\w)|[×x](?!\w))){UNIT}?(?!\w|\.\d)")


def quoted_figures(text: str) -> list[tuple[str, str]]:
    """(number, the figure as quoted) for each measured figure in a Markdown text's prose."""
    text = FENCED.sub(" ", text)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = NAMED_SETTING.sub(" ", VERSION.sub(" ", " ".join(text.split())))
    return [(match["number"], match[0]) for match in FIGURE.finditer(text)]


def test_every_figure_the_readme_and_usage_quote_appears_in_results():
    """README and USAGE cite bench/RESULTS.md for what was measured: any figure they quote is one it holds verbatim."""
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    documents = {"README.md": GENERATED.sub(" ", (ROOT / "README.md").read_text()),
                 "docs/USAGE.md": (ROOT / "docs" / "USAGE.md").read_text()}
    quoted = {name: quoted_figures(text) for name, text in documents.items()}
    missing = [f"{name}: {figure!r}" for name, figures in quoted.items() for number, figure in figures
               if not re.search(rf"(?<![\w.]){re.escape(number)}(?!\.?\d)", results)]
    assert not missing, "figures not in bench/RESULTS.md (cite its section instead): " + ", ".join(missing)


def test_the_figure_pattern_tells_measured_figures_from_settings_names_and_versions():
    assert quoted_figures("on one H200 it takes 45.5 s at 66.6 GiB, 0.82× and 5× the time, ppl 12.34, 371 s") == [
        ("45.5", "45.5 s"), ("66.6", "66.6 GiB"), ("0.82", "0.82×"), ("5", "5×"), ("12.34", "12.34"), ("371", "371 s")]
    assert quoted_figures("80% of 128 × 2048 tokens in 2 shots at 2:4, λ_A = 0.3, sec. 3.4, torch 2.13.0+cpu, "
                          "vLLM 0.32, transformers 5.15–5.17, Qwen1.5-MoE-A2.7B, Mixtral-8x7B, `--target-size 0.8`, "
                          "ICLR 2024, [a link](bench/RESULTS.md#v1.25)") == []


def test_rows_run_over_calibration_seeds_show_their_spread_and_leave_the_quality_table():
    from bench.results_md import quality_table
    from bench.seeds import seed_spread

    config = {"structure": "2:4", "target_size": 0.5, "method": "sparsegpt", "shots": 1, "damp_g": 0.1, "damp_a": 0.01,
              "max_correlate": 0}
    runs = {"dense": {"ppl": 19.0, "seconds": 50}, **{name: {"ppl": ppl, "seconds": 60, "sparsity": 0.5,
                                                               "config": config}
                                                        for name, ppl in (("x", 30.0), ("x-seed1", 31.0),
                                                                          ("x-seed2", 29.5), ("y", 40.0))}}
    for run in runs.values():
        run["commit"] = "0000000"
    spread = seed_spread(runs)
    assert spread[-1] == "| x | 0, 1, 2 | 30.000, 31.000, 29.500 | 30.167 | 29.500–31.000 |"
    for name, tuning in (("x", 28.0), ("x-seed1", 27.0), ("x-seed2", 26.0)):
        runs[name]["tuning_ppl"] = tuning
    assert seed_spread(runs)[-1].endswith("| 27.000 | 26.000–28.000 |")  # the tuning windows', beside
    assert "| 30.000 | 28.000 | 60 |" in quality_table(runs)
    assert "-seed" not in quality_table(runs) and "| y |" in quality_table(runs)
    assert seed_spread({"dense": runs["dense"], "y": runs["y"]}) == []
    runs["x"]["commit"] = "1111111"  # seed 0 run again at a later commit: the other seeds are not its spread
    assert seed_spread(runs) == []


def test_the_runners_name_a_seeded_row_as_the_spread_reads_it():
    import argparse

    from bench.seeds import add_seeds_option, seed_row, seeded

    assert seed_row("2of4-0.5-llmc-sparsegpt", 0) == "2of4-0.5-llmc-sparsegpt"  # seed 0: the table's own row
    assert seeded(seed_row("2of4-0.5-llmc-sparsegpt", 2)) == ("2of4-0.5-llmc-sparsegpt", 2)
    assert seeded(seed_row("coupled-0.8", 0)) is None
    parser = argparse.ArgumentParser()
    add_seeds_option(parser)
    assert parser.parse_args([]).seeds == [0] and parser.parse_args(["--seeds", "0", "1", "2"]).seeds == [0, 1, 2]


def test_the_coupled_table_keeps_seeded_rows_for_the_spread_below_it(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT))
    from bench import provenance
    from bench.quality.coupled import SECTIONS

    if provenance.git("cat-file", "-e", "5768318^{commit}").returncode != 0:
        pytest.skip("needs the repository's history")
    (tmp_path / "coupled").mkdir()
    for row, ppl, tuning in (("coupled-0.8", 30.0, 32.0), ("coupled-0.8-seed1", 31.0, 33.0),
                             ("coupled-0.8-seed2", 29.0, 31.0), ("coupled-0.7", 40.0, 42.0)):
        (tmp_path / "coupled" / f"{row}@5768318.json").write_text(json.dumps(dict(
            ppl=ppl, tuning_ppl=tuning, parameters=80, dense_parameters=100, format="decilm",
            decode_tokens_per_s=10.0, seconds=1.0, machine="cpu a", commit="5768318")))
    monkeypatch.setattr(provenance, "RESULTS", tmp_path)
    lines = SECTIONS["coupled"]()
    assert [line.split(" | ")[0] for line in lines[2:4]] == ["| coupled-0.7", "| coupled-0.8"]
    assert not any("-seed" in line for line in lines[:5]) and lines[4] == ""
    assert lines[-1] == ("| coupled-0.8 | 0, 1, 2 | 30.000, 31.000, 29.000 | 30.000 | 29.000–31.000 | 32.000 | "
                         "31.000–33.000 |")


def test_the_oneshot_times_leave_out_runs_with_other_calibration_seeds(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT))
    from bench import provenance
    from bench.results_md import SECTIONS

    if provenance.git("cat-file", "-e", "5768318^{commit}").returncode != 0:
        pytest.skip("needs the repository's history")
    (tmp_path / "quality").mkdir()
    for row, seconds in (("2of4-0.5-llmc-sparsegpt", 40.0), ("2of4-0.5-llmc-sparsegpt-seed1", 50.0),
                         ("2of4-0.5-llmc-surgeon-sparsegpt", 36.0)):
        (tmp_path / "quality" / f"{row}@5768318.json").write_text(json.dumps(dict(
            ppl=70.0, tuning_ppl=66.0, seconds=seconds, commit="5768318", machine="cpu a")))
    monkeypatch.setattr(provenance, "RESULTS", tmp_path)
    lines = SECTIONS["oneshot"]()
    assert [line.split(" | ")[1] for line in lines[2:]] == ["SparseGPTModifier", "SurgeonSparseGPTModifier (refine)"]
    assert lines[3].split(" | ")[4] == "0.90×"  # against seed 0's run, not the other seed's


def test_seeds_run_at_another_commit_join_the_spread_only_with_the_same_pruning_code_on_the_same_machine(monkeypatch):
    from bench import provenance
    from bench.seeds import seed_spread

    config = {"structure": "2:4", "target_size": 0.5, "method": "sparsegpt", "shots": 1, "damp_g": 0.1, "damp_a": 0.01,
              "max_correlate": 0}
    runs = {name: {"ppl": ppl, "seconds": 60, "sparsity": 0.5, "config": config, "commit": commit, "machine": "cpu a"}
            for name, ppl, commit in (("x", 30.0, "0000000"), ("x-seed1", 31.0, "0000000"),
                                      ("x-seed2", 29.5, "1111111"))}
    same = {frozenset(("0000000", "1111111")): True}
    monkeypatch.setattr(provenance, "same_code", lambda first, second: same[frozenset((first, second))])
    assert seed_spread(runs)[-1] == "| x | 0, 1, 2 | 30.000, 31.000, 29.500 | 30.167 | 29.500–31.000 |"
    runs["x-seed2"]["machine"] = "cpu b"  # another machine's arithmetic moves a row: not the seed's spread
    assert seed_spread(runs)[-1].startswith("| x | 0, 1 |")
    runs["x-seed2"]["machine"], same[frozenset(("0000000", "1111111"))] = "cpu a", False  # the pruning code changed
    assert seed_spread(runs)[-1].startswith("| x | 0, 1 |")


def test_a_row_no_command_runs_leaves_the_tables_and_a_finding_cites_its_file():
    sys.path.insert(0, str(ROOT))
    from bench import provenance
    from bench.results_md import runnable

    run = {"ppl": 30.0, "seconds": 60}
    kept = ("dense", "unstructured-0.5-sparsegpt", "2of4-0.5-surgeon-alone-sampled-seed1", "4of8-0.5-llmc-wanda")
    assert runnable({name: run for name in (*kept, "unstructured-0.5-sparsegpt-made-up")}).keys() == set(kept)
    cited = {file for path in (provenance.RESULTS / "findings").glob("*.json")
             for file in provenance.load(path).get("results_files", [])}
    for folder in [path.name for path in provenance.RESULTS.glob("quality*") if path.is_dir()]:
        runs = provenance.newest_runs(folder)
        for name in runs.keys() - runnable(runs).keys():
            assert f"bench/results/{folder}/{name}@{runs[name]['commit']}.json" in cited, (folder, name)


def test_a_default_weighed_from_its_rows_run_apart_keeps_the_lower_held_out_loss():
    from bench.quality.table import weighed

    def row(ppl: float, loss: float, seconds: float, method: str) -> dict:
        config = PruneConfig(structure="2:4", method=method, held_out_choice=False if method == "surgeon" else None)
        return {"ppl": ppl, "held_out_loss": loss, "seconds": seconds, "config": config.resolved(), "machine": "m"}

    default = weighed(row(40.0, 3.0, 100, "surgeon"), row(45.0, 3.1, 30, "sparsegpt-refine"))
    assert default["ppl"] == 40.0 and default["seconds"] == 130 and default["choice"]["kept"] == "surgeon"
    assert default["config"] == PruneConfig(structure="2:4").resolved() and default["config"]["held_out_choice"]
    assert weighed(row(40.0, 3.2, 100, "surgeon"), row(45.0, 3.1, 30, "sparsegpt-refine"))["ppl"] == 45.0
    assert weighed(row(40.0, 3.1, 100, "surgeon"), row(45.0, 3.1, 30, "sparsegpt-refine"))["ppl"] == 40.0  # a tie


def test_a_row_stopped_after_a_shot_continues_from_its_checkpoint_to_the_same_model(tmp_path, monkeypatch,
                                                                                     tiny_model_dir):
    from bench.quality import table
    from surgeon.models.adapter import load_model
    from surgeon.pruning import shots

    model, tokenizer = load_model(str(tiny_model_dir))
    ids = torch.randint(0, 49152, (6, 32), generator=torch.Generator().manual_seed(0))
    text = ids[4:].reshape(1, -1)
    run = table.Protocol(model, {k: v.clone() for k, v in model.state_dict().items()}, tokenizer, text, text, ids,
                         None, ids[:4], None)
    evaluate = table.perplexity
    monkeypatch.setattr(table, "perplexity", lambda model, ids, seqlen, *args, **kwargs: evaluate(model, ids, 32,
                                                                                                   *args, **kwargs))
    config = PruneConfig(structure="structured", target_size=0.5, shots=3, method="kobd")
    whole = table.measure(run, config, 2)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    ran, stop, shot = [], [3], shots._LayerShots.shot

    def stopped(self, number, *args):
        ran.append(number)
        if stop and number == stop[0]:
            stop.pop()
            raise KeyboardInterrupt
        return shot(self, number, *args)

    monkeypatch.setattr(shots._LayerShots, "shot", stopped)
    row = tmp_path / "row"
    with pytest.raises(KeyboardInterrupt):
        table.measure(run, config, 2, row)
    continued = table.measure(run, config, 2, row)
    assert ran == [1, 2, 3, 3]  # the continued run began at the shot that was stopped
    assert continued["ppl"] == whole["ppl"] and len(continued["shots"]) == 3
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert not (row / "checkpoint.json").exists()  # the finished row leaves no checkpoint
    stop.append(2)
    with pytest.raises(KeyboardInterrupt):
        table.measure(run, config, 2, row)
    for tensors in row.glob("*.safetensors"):  # a checkpoint whose tensors are gone: the row starts again
        tensors.unlink()
    again = table.measure(run, config, 2, row)
    assert ran[4:] == [1, 2, 1, 2, 3] and again["ppl"] == whole["ppl"]
    stop.append(2)
    with pytest.raises(KeyboardInterrupt):
        table.measure(run, config, 2, row)
    other = table.measure(run, dataclasses.replace(config, shots=2), 2, row)  # another configuration's checkpoint
    assert ran[9:] == [1, 2, 1, 2] and len(other["shots"]) == 2  # is not continued: the row starts again
