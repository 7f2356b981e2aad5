"""Zero-shot tasks through lm-eval on a task the tests define on local files (no download)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

pytest.importorskip("lm_eval", reason="the tasks extra (lm-eval)")

from surgeon.app.tasks import DEFAULT_TASKS, load_tasks, task_names, zero_shot  # noqa: E402
from surgeon.errors import SurgeonError  # noqa: E402

DOCS = [{"question": f"Question {i}: which colour is the sky over the {place}?", "choices": ["blue", "green", "red"],
         "answer": i % 3} for i, place in enumerate(["sea", "hills", "town", "fields", "forest", "river", "desert"])]


def write_task(folder, name: str, data_file) -> None:
    (folder / f"{name}.yaml").write_text(f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data_file}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
""")


@pytest.fixture
def task_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    data = tmp_path / "sky.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    write_task(tmp_path, "sky_choice", data)
    write_task(tmp_path, "sky_missing", tmp_path / "absent.jsonl")
    return tmp_path


@pytest.fixture
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


def expected_accuracy(model, tokenizer) -> float:
    """Multiple choice by hand: the choice whose tokens after the question have the highest log-likelihood."""
    correct = 0
    for doc in DOCS:
        scores = []
        for choice in doc["choices"]:
            context = tokenizer(doc["question"], add_special_tokens=False).input_ids
            whole = tokenizer(doc["question"] + " " + choice, add_special_tokens=False).input_ids
            continuation = whole[len(context):]
            with torch.no_grad():
                logits = model(torch.tensor([whole[:-1]])).logits[0, -len(continuation):]
            scores.append(float(logits.log_softmax(-1)[torch.arange(len(continuation)), continuation].sum()))
        correct += int(max(range(len(scores)), key=scores.__getitem__) == doc["answer"])
    return correct / len(DOCS)


@pytest.mark.slow  # runs lm-eval's harness
def test_zero_shot_accuracy_is_the_multiple_choice_argmax(tiny, task_dir):
    model, tokenizer = tiny
    result = zero_shot(model, tokenizer, ["sky_choice"], load_tasks(["sky_choice"], str(task_dir)))
    assert result["sky_choice"]["samples"] == len(DOCS)
    assert result["sky_choice"]["acc"] == pytest.approx(expected_accuracy(model, tokenizer))
    assert result["sky_choice"]["acc_stderr"] > 0
    limited = zero_shot(model, tokenizer, ["sky_choice"], load_tasks(["sky_choice"], str(task_dir)), limit=3)
    assert limited["sky_choice"]["samples"] == 3


def test_task_names():
    assert task_names("piqa, arc_easy") == ("piqa", "arc_easy")
    assert task_names("default") == DEFAULT_TASKS
    with pytest.raises(ValueError, match="at least one"):
        task_names(" , ")


@pytest.mark.slow  # runs lm-eval's harness
def test_unknown_task_and_unreachable_data_are_named(task_dir):
    with pytest.raises(SurgeonError, match="unknown lm-eval task no_such_task"):
        load_tasks(["sky_choice", "no_such_task"], str(task_dir))
    with pytest.raises(SurgeonError, match="cannot load the data of task sky_missing"):
        load_tasks(["sky_choice", "sky_missing"], str(task_dir))


def test_missing_lm_eval_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval.tasks", None)
    with pytest.raises(SurgeonError, match=r"pip install 'llm-surgeon\[tasks\]'"):
        load_tasks(["piqa"])


@pytest.mark.slow  # runs lm-eval's harness
def test_eval_and_prune_commands_score_tasks(tiny_model_dir, task_dir, tmp_path):
    from surgeon.app.cli import main

    common = ["--model", str(tiny_model_dir), "--seqlen", "64", "--eval-windows", "1", "--tasks", "sky_choice"]
    assert main(["--quiet", "eval", *common, "--task-path", str(task_dir), "--task-limit", "4",
                 "--output", str(tmp_path / "eval.json")]) == 0
    scored = json.loads((tmp_path / "eval.json").read_text())["tasks"]["sky_choice"]
    assert scored["samples"] == 4 and 0 <= scored["acc"] <= 1
    out = tmp_path / "pruned"
    (tmp_path / "tasks.yaml").write_text(f"task_path: {task_dir}\n")  # a setting of the --config file
    assert main(["--quiet", "prune", *common, "--structure", "unstructured", "--target-size", "0.5", "--shots", "1",
                 "--nsamples", "2", "--calibration", "wikitext2-valid", "--config", str(tmp_path / "tasks.yaml"),
                 "--output", str(out)]) == 0
    tasks = json.loads((out / "report.json").read_text())["tasks"]
    assert set(tasks) == {"before", "after"}
    assert tasks["before"]["sky_choice"]["samples"] == tasks["after"]["sky_choice"]["samples"] == len(DOCS)


def test_bad_task_fails_before_the_model_loads(task_dir, tmp_path, capsys):
    from surgeon.app.cli import main

    out = tmp_path / "pruned"
    (tmp_path / "tasks.json").write_text(json.dumps({"task_path": str(task_dir)}))
    code = main(["prune", "--model", str(tmp_path / "no-model"), "--tasks", "sky_missing", "--config",
                 str(tmp_path / "tasks.json"), "--output", str(out)])
    assert code == 2 and not out.exists()
    assert "cannot load the data of task sky_missing" in capsys.readouterr().err
