"""The command line: eval and prune on a tiny saved model, and one-line errors on bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from surgeon import PruneConfig
from surgeon.app import cli
from surgeon.app.cli import main
from tests._helpers import one_error_line, run_cli
from tests._tolerances import assert_reaches_target


def test_eval_writes_json(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    code = main(["--quiet", "eval", "--model", str(tiny_model_dir), "--seqlen", "128", "--eval-windows", "2",
                 "--output", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["windows"] == 2 and data["tokens"] == 256 and data["ppl"] > 1000  # random weights
    assert "perplexity" in capsys.readouterr().out


def test_prune_writes_report_and_loadable_checkpoint(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "pruned"
    code = main(["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "structured",
                 "--target-size", "0.7", "--shots", "2", "--nsamples", "2", "--seqlen", "64",
                 "--calibration", "wikitext2-valid", "--eval-windows", "1", "--output", str(out)])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    for key in ("ppl_before", "ppl_after", "sparsity", "layers", "shots"):
        assert key in report
    assert len(report["shots"]) == 2
    model = AutoModelForCausalLM.from_pretrained(out)
    shapes = [tuple(model.get_submodule(name).weight.shape) for name in report["layers"]]
    assert_reaches_target(report["removed"], shapes, 0.7, "structured", freed=sum(s["freed"] for s in report["shots"]))
    zeros = [(m.weight == 0).float().mean().item() for n, m in model.named_modules() if n in report["layers"]]
    assert zeros == pytest.approx(list(report["layers"].values()))
    assert not list(tmp_path.glob(".pruned.*"))  # no temporary leftovers


@pytest.mark.slow  # a subprocess: what the command prints is the point
@pytest.mark.parametrize("args,message", [
    (["eval", "--model", "/no/such/model"], "does not exist"),
    (["eval", "--model", "missing.gguf"], "does not exist"),
    (["eval", "--model", "smollm2-135m", "--dataset", "/no/such/file.txt"], "does not exist"),
    (["prune", "--target-size", "1.5", "--output", "x"], "target_size"),
    (["prune", "--shots", "0", "--output", "x"], "shots"),
])
def test_bad_input_one_line_error(args, message):
    assert message in one_error_line(run_cli(*args))


@pytest.mark.slow  # a subprocess: what the command prints is the point
@pytest.mark.parametrize("args,message", [
    (["prune", "--dtype", "foo", "--output", "x"], "invalid choice: 'foo'"),
    (["prune", "--shots", "many", "--output", "x"], "invalid int value"),
    (["prune", "--model", "smollm2-135m"], "required: --output"),
    (["frobnicate"], "invalid choice"),
    (["prune", "--output", "x", "--no-such-option"], "unrecognized arguments"),
    (["prune", "--structure", "3:4", "--target-size", "0.9", "--output", "x"], "structure 3:4 keeps 0.75"),
])
def test_argparse_errors_are_one_line(args, message):
    assert message in one_error_line(run_cli(*args))


def test_nm_structure_records_what_it_does(tiny_model_dir, tmp_path):
    out = tmp_path / "nm"
    code = main(["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "2:4", "--shots", "1",
                 "--method", "magnitude", "--nsamples", "1", "--seqlen", "64", "--calibration", "wikitext2-valid",
                 "--eval-windows", "1", "--output", str(out)])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["target_size"] == 0.5 and report["sparsity"] == 0.5


def test_the_last_lines_name_the_model_kept_and_repeat_a_skipped_choice(tiny_model_dir, tmp_path, capsys):
    """A default 2:4 run says whose model it kept; where the calibration text leaves no room for held-out windows,
    the choice is skipped with a warning that the run's last line repeats and report.json records."""
    args = ["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "2:4", "--nsamples", "2", "--seqlen",
            "32", "--eval-windows", "1"]
    assert main([*args, "--calibration", "wikitext2-valid", "--output", str(tmp_path / "weighed")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    kept = json.loads((tmp_path / "weighed" / "report.json").read_text())["choice"]["kept"]
    assert f"kept {kept}'s model by held-out loss; saved to" in last
    short = tmp_path / "short.txt"
    short.write_text("the " * 40)  # more tokens than one window, too few for held-out windows beside them
    assert main([*args, "--calibration", str(short), "--output", str(tmp_path / "alone")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    report = json.loads((tmp_path / "alone" / "report.json").read_text())
    assert last.startswith("warning: held-out choice skipped: no held-out windows")
    assert report["warnings"] == [last.removeprefix("warning: ")] and report["choice"] is None


@pytest.mark.slow  # a subprocess: what the command prints is the point
def test_refuses_a_non_empty_output_before_any_work(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "keepme.txt").write_text("mine")
    (out / "sub" / "notes.md").write_text("notes")
    line = one_error_line(run_cli("prune", "--model", "/no/such/model", "--output", str(out)))
    assert "not empty" in line and "--overwrite" in line  # the output is checked before the model
    assert (out / "keepme.txt").read_text() == "mine" and (out / "sub" / "notes.md").read_text() == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.slow  # a subprocess: what the command prints is the point
def test_unsplittable_experts_are_refused_before_any_weight_loads(tmp_path):
    """A Mixture-of-Experts folder holding only its config: the refusal comes from the config, before the weights."""
    from tests._families import family_model

    family_model("gpt_oss").config.save_pretrained(tmp_path / "gpt_oss")
    result = run_cli("prune", "--model", str(tmp_path / "gpt_oss"), "--structure", "unstructured", "--target-size",
                     "0.5", "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("surgeon: error:")]
    assert "gpt_oss: 8 weight matrices" in line and "model.layers.*.mlp.experts.gate_up_proj" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a subprocess: what the command prints is the point
def test_unwritable_output_fails_before_the_model_loads(tmp_path):
    (tmp_path / "a-file").write_text("x")
    for command in ("prune", "eval"):
        line = one_error_line(run_cli(command, "--model", "/no/such/model", "--output", str(tmp_path / "a-file" / "o")))
        assert "a-file" in line and "does not exist" not in line


def test_overwrite_keeps_the_users_other_files(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keepme.txt").write_text("mine")
    args = ["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "structured", "--shots", "1",
            "--nsamples", "1", "--seqlen", "64", "--calibration", "wikitext2-valid", "--eval-windows", "1",
            "--output", str(out), "--overwrite"]
    assert main(args) == 0
    assert (out / "keepme.txt").read_text() == "mine" and (out / "report.json").is_file()
    assert (out / "model.safetensors").is_file()


@pytest.mark.slow  # a subprocess: what the command prints is the point
@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_end_cleanly_and_leave_no_output(tiny_model_dir, tmp_path, signum, code):
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "surgeon", "prune", "--model", str(tiny_model_dir), "--structure", "structured",
         "--shots", "50", "--nsamples", "64", "--seqlen", "128", "--calibration", "wikitext2-valid",
         "--eval-windows", "1", "--output", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(tmp_path.glob(".out.*")) and time.monotonic() < deadline:  # staged: the run has begun
        time.sleep(0.05)
    time.sleep(2.0)  # into the model load or the pruning
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == "surgeon: interrupted" and "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []  # no output folder and no staging folder


@pytest.mark.slow  # a subprocess: what the command prints is the point
def test_unknown_model_offline_fails_at_once_naming_the_builtins():
    # A closed loopback port stands for an unreachable hub; hub warnings are let through so a retry would show.
    result = run_cli("eval", "--model", "no-such-org/no-such-model",
                     env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_VERBOSITY": "warning",
                          "TRANSFORMERS_VERBOSITY": "warning"})
    line = one_error_line(result)
    assert "unreachable" in line and "HF_HUB_OFFLINE=1" in line and "smollm2-135m" in line


@pytest.mark.slow  # a subprocess: what the command prints is the point
def test_offline_mode_is_named():
    line = one_error_line(run_cli("eval", "--model", "no-such-org/no-such-model", env={"HF_HUB_OFFLINE": "1"}))
    assert "HF_HUB_OFFLINE is set" in line and "smollm2-135m" in line


@pytest.mark.slow  # a subprocess: what the command prints is the point
def test_version_and_help_need_no_torch():
    from surgeon import __version__

    assert run_cli("--version").stdout.strip() == f"surgeon {__version__}"
    probe = "import sys, surgeon.app.cli; surgeon.app.cli.build_parser(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"


def test_help_explains_each_option_once():
    from surgeon.app.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # the eval, prune and export parsers
    for command in commands.values():
        for action in command._actions:
            if action.dest == "help" or not action.option_strings:  # positionals are required by their place
                continue
            assert action.help and action.help.count("(default:") <= 1, action.dest
            assert "None" not in action.help, action.dest
            assert ("(required)" in action.help) == action.required, action.dest
    method = next(a for a in commands["prune"]._actions if a.dest == "method").help
    for name in ("lobd: L-OBD", "kobd: K-OBD", "sparsegpt:", "wanda:", "magnitude:"):
        assert name in method
    from surgeon.models.builtin import EMBEDDED_MODELS

    for command in commands.values():  # --model names every built-in model, wherever it is offered
        for action in command._actions:
            if action.dest == "model":
                assert all(name in action.help for name in EMBEDDED_MODELS), action.help


def test_a_setting_resolved_by_structure_is_switched_either_way():
    from surgeon.app.cli import _build, build_parser
    from surgeon.errors import SurgeonError

    def config(*args: str) -> PruneConfig:
        return _build(PruneConfig, build_parser().parse_args(["prune", "--output", "out", *args]))

    assert config("--structure", "2:4").propagates
    assert not config("--structure", "2:4", "--no-propagate").propagates
    assert not config("--structure", "unstructured").propagates
    assert config("--structure", "unstructured", "--propagate").propagates
    with pytest.raises(SurgeonError, match="propagate prunes the last element shot"):
        config("--structure", "coupled", "--propagate")


@pytest.mark.slow  # a subprocess: what the command prints is the point
def test_seqlen_longer_than_model_allows(tiny_model_dir):
    result = run_cli("eval", "--model", str(tiny_model_dir), "--seqlen", "512")
    assert result.returncode == 2 and "longer than the model allows" in result.stderr


@pytest.mark.slow  # a subprocess: what the command prints is the point
def test_help_documents_prune_options():
    result = run_cli("prune", "--help")
    for option in ("--structure", "--target-size", "--shots", "--method", "--max-correlate", "--config",
                   "--nsamples", "--seqlen", "--calibration", "--eval-windows", "--device", "--output"):
        assert option in result.stdout


def test_prune_help_groups_every_option():
    """`surgeon prune --help` lists each option under one of its groups, none left in the flat list."""
    from surgeon.app.cli import PRUNE_GROUPS, build_parser

    prune = build_parser()._subparsers._group_actions[0].choices["prune"]  # type: ignore[union-attr]
    titles = {group.title: [action.dest for action in group._group_actions] for group in prune._action_groups}
    assert titles.pop("options") == ["help"] and titles.pop("positional arguments") == []
    assert list(titles) == list(PRUNE_GROUPS)
    for title, names in PRUNE_GROUPS.items():
        assert sorted(titles[title]) == sorted(names + ("config",) * (title == "the method")), title
    assert sum(map(len, titles.values())) <= 36


def test_config_file_sets_any_field_and_the_command_line_overrides_it(tmp_path):
    """`--config` (JSON or YAML) sets fields shown as options and fields that are not; an option given wins."""
    from surgeon.app.cli import _build, build_parser, read_settings
    from surgeon.app.settings import RunConfig

    def built(*args: str) -> tuple[RunConfig, PruneConfig]:
        argv = ["prune", "--output", "out", *args]
        parsed = build_parser().parse_args(argv)
        parsed = build_parser(read_settings(parsed.config)).parse_args(argv)
        return _build(RunConfig, parsed), _build(PruneConfig, parsed)

    (tmp_path / "a.yaml").write_text("structure: unstructured\nshots: 3\ncg-tol: 1.0e-5\ncorrelation: within\n"
                                     "damp_g: 1\ntokenizer: tok\ncheckpoint_shots: 0\n")
    run, config = built("--config", str(tmp_path / "a.yaml"), "--shots", "5")
    assert (config.structure, config.shot_count, config.cg_tol, config.correlation, config.strengths[0]) == \
        ("unstructured", 5, 1e-5, "within", 1.0)
    assert (run.tokenizer, run.checkpoint_shots, run.output) == ("tok", 0, "out")
    (tmp_path / "b.json").write_text(json.dumps({"propagate": False, "structure": "2:4"}))
    assert built("--config", str(tmp_path / "b.json"))[1].propagates is False
    assert built("--config", str(tmp_path / "b.json"), "--propagate")[1].propagates is True


@pytest.mark.parametrize("text, message", [
    ('{"shots": "4"}', "shots = '4' is not a valid int"),
    ('{"shots": true}', "shots = True is not a valid int"),
    ('{"structure": null}', "structure = null is not a valid str"),
    ('{"correlation": "both"}', "correlation = 'both' is not a valid str (one of joint, within)"),
    ('{"kronecker_terms": 2}', "'kronecker_terms' is not a setting of surgeon prune"),
    ('{"output": "x"}', "'output' is not a setting of surgeon prune (give --output on the command line)"),
    ("[1, 2]", "expected a mapping of setting names to values"),
    ("{", "Expecting property name"),
])
def test_bad_config_file_is_one_line_naming_it(tmp_path, capsys, text, message):
    (tmp_path / "settings.json").write_text(text)
    assert main(["prune", "--config", str(tmp_path / "settings.json"), "--output", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"surgeon: error: --config {tmp_path / 'settings.json'}: ") and message in error
    assert error.count("\n") == 1 and not (tmp_path / "out").exists()


def test_the_last_line_stands_on_its_own_after_a_progress_bar_left_open(capsys):
    """A stop or an error inside a progress bar (transformers' weight loading) prints its line after the bar's, not
    on it."""
    from tqdm import tqdm

    from surgeon.app.cli import _last_line

    bar = tqdm(total=20, desc="Loading weights", file=sys.stderr)
    bar.update()
    _last_line("surgeon: interrupted")
    err = capsys.readouterr().err
    assert "Loading weights" in err and err.split("\n")[-2] == "surgeon: interrupted"


@pytest.mark.parametrize("stop,code", [(KeyboardInterrupt, 130), (cli.Terminated, 143)])
def test_a_stop_a_library_wraps_still_ends_as_interrupted(monkeypatch, capsys, stop, code):
    # A Ctrl-C inside an extension module's import surfaces as ImportError("initialization failed") raised from it.
    def interrupted_import(args: object) -> int:
        try:
            raise stop()
        except BaseException as error:
            raise ImportError("initialization failed") from error

    monkeypatch.setattr(cli, "_cmd_eval", interrupted_import)
    assert main(["eval", "--model", "smollm2-135m"]) == code
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "surgeon: interrupted" and "Traceback" not in err


def test_an_error_without_a_stop_behind_it_is_not_called_an_interruption(monkeypatch):
    def failing(args: object) -> int:
        raise ImportError("initialization failed")

    monkeypatch.setattr(cli, "_cmd_eval", failing)
    with pytest.raises(ImportError):
        main(["eval", "--model", "smollm2-135m"])
