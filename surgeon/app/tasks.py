"""Zero-shot task accuracy through lm-evaluation-harness (optional extra `tasks`).

The loaded model is wrapped in lm-eval's `HFLM(pretrained=model, tokenizer=…)` and scored with
`simple_evaluate`, so the numbers are lm-eval's own. `DEFAULT_TASKS` are the zero-shot tasks
of the paper's appendix.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from surgeon.errors import SurgeonError, first_line

if TYPE_CHECKING:  # importing this module does not load torch
    import torch

logger = logging.getLogger(__name__)

DEFAULT_TASKS = (  # the zero-shot tasks of the paper's appendix
    "boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")


def task_names(spec: str) -> tuple[str, ...]:
    """`"piqa,arc_easy"` -> ("piqa", "arc_easy"); `"default"` -> `DEFAULT_TASKS`."""
    names = tuple(name.strip() for name in spec.split(",") if name.strip())
    if not names:
        raise ValueError(f"tasks={spec!r}: name at least one lm-eval task, or default")
    return DEFAULT_TASKS if names == ("default",) else names



def load_tasks(tasks: Sequence[str], task_path: str | None = None) -> Any:
    """lm-eval's `TaskManager` with every one of `tasks` loaded once: an unknown task or unreachable data fails here.

    task_path: a folder of lm-eval task YAML files to add to lm-eval's own (its `--include_path`).
    """
    try:
        from lm_eval.tasks import TaskManager
    except ImportError as error:
        raise SurgeonError("zero-shot tasks need lm-evaluation-harness: pip install 'llm-surgeon[tasks]'") from error
    manager = TaskManager(include_path=task_path)
    unknown = [name for name in tasks if name not in manager.all_tasks]
    if unknown:
        raise SurgeonError(f"unknown lm-eval task {', '.join(unknown)}; `lm-eval ls tasks` lists them, --task-path "
                           "adds a folder of task YAML files")
    for name in tasks:
        try:
            manager.load([name])
        except Exception as error:  # datasets raises many kinds: connection, missing file, bad config
            raise SurgeonError(f"cannot load the data of task {name}: {first_line(error)}") from error
    return manager


def zero_shot(model: torch.nn.Module, tokenizer: Any, tasks: Sequence[str], manager: Any, *,
              limit: int | None = None, batch_size: int = 1) -> dict[str, dict[str, float]]:
    """Accuracy of `model` on each of `tasks`, zero-shot: {task: {"acc": …, "acc_stderr": …, "acc_norm": …}}.

    manager: the `load_tasks` of these tasks. limit: score only the first `limit` documents of each task.
    """
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    device = next(model.parameters()).device
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(device))
    was_training = model.training
    output = simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit, log_samples=False)
    model.train(was_training)
    assert output is not None  # None only on ranks other than 0
    results: dict[str, dict[str, float]] = {}
    for name in tasks:
        metrics = output["results"][name]
        results[name] = {key.split(",")[0]: float(value) for key, value in metrics.items()
                         if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "sample_len"}
        samples = output.get("n-samples", {}).get(name, {}).get("effective")  # groups report theirs per subtask
        if samples is not None:
            results[name]["samples"] = float(samples)
        logger.info("%s: %s", name, ", ".join(f"{key} {value:.4f}" for key, value in results[name].items()))
    return results
