"""Run by torchrun from tests/test_distributed.py: every case pruned by all ranks together (gloo, CPU).

Rank 0 saves what each case produced to the file named on the command line; the test compares it
with one process's run of the same case.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from surgeon import PruneConfig, prune
from surgeon.errors import SurgeonError
from surgeon.method.threshold import smallest_k
from surgeon.pruning.resume import Checkpoint, read_state
from surgeon.recovery.distill import Distill, Distillation
from surgeon.scale.distributed import shard_model
from tests._helpers import pruned_pair, tiny_model

WINDOWS = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(0))
TIGHT = dict(cg_tol=1e-10, cg_max_iter=1000)  # converged solves: what is left is the factors' reduction order
CASES = {
    "llama-structured": ("llama", dict(structure="structured", target_size=0.6)),
    "opt-structured": ("opt", dict(structure="structured", target_size=0.6)),
    "llama-unstructured": ("llama", dict(structure="unstructured", target_size=0.5, **TIGHT)),
    "opt-unstructured": ("opt", dict(structure="unstructured", target_size=0.5, **TIGHT)),
    "llama-2:4": ("llama", dict(structure="2:4", **TIGHT)),
    "opt-2:4": ("opt", dict(structure="2:4", **TIGHT)),  # the last shot propagated block by block (the default)
    "llama-2:4-unpropagated": ("llama", dict(structure="2:4", propagate=False, **TIGHT)),
    "llama-unstructured-propagated": ("llama", dict(structure="unstructured", target_size=0.5, propagate=True,
                                                     **TIGHT)),
    "llama-unstructured-bounded": ("llama", dict(structure="unstructured", target_size=0.5, propagate=True,
                                                  layer_deviation=0.05, **TIGHT)),
    "llama-coupled": ("llama", dict(structure="coupled", target_size=0.7)),
    "llama-coupled-offload": ("llama", dict(structure="coupled", target_size=0.7, activation_checkpointing=True,
                                            offload=True, block_groups=2)),
    "opt-sparsegpt": ("opt", dict(method="sparsegpt", structure="unstructured", target_size=0.5, shots=1)),
}
# Costs with ties at τ in every layer, layers 0 and 2 on rank 0, layer 1 on rank 1.
TIED = [torch.tensor([0.0, 0.0, 3.0, 1.0]), torch.tensor([0.0, 2.0, 0.0]), torch.tensor([5.0, 0.0, 0.0, 0.0, 1.0])]


# Split by blocks (every rank runs every batch): the factors, and so the result, are those of one process.
BLOCKS = {
    "llama-structured-blocks": ("llama", dict(structure="structured", target_size=0.6, curvature_split="blocks")),
    "opt-2:4-blocks": ("opt", dict(structure="2:4", curvature_split="blocks")),
    "opt-unstructured-blocks": ("opt", dict(structure="unstructured", target_size=0.5, curvature_split="blocks")),
    "llama-sparsegpt-blocks": ("llama", dict(method="sparsegpt", structure="2:4", shots=1, curvature_split="blocks")),
    "llama-structured-blocks-offload": ("llama", dict(structure="structured", target_size=0.6, curvature_split="blocks",
                                                      activation_checkpointing=True, offload=True)),
}
CASES.update(BLOCKS)
FSDP = ["llama-structured", "opt-structured", "llama-unstructured", "opt-unstructured", "llama-2:4", "opt-2:4",
        "llama-unstructured-propagated", "llama-coupled-offload", *BLOCKS]


class Stop(Exception):
    """Stands for a run that dies after a shot."""


def model_of(arch: str, fsdp: bool) -> torch.nn.Module:
    """The tiny model, its weights sharded over the ranks with FSDP2 when `fsdp`."""
    model = tiny_model(arch)
    if fsdp:
        shard_model(model, "cpu")
    return model


def whole(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (gathered from its shards)."""
    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for name, p in model.named_parameters()}


def run(case: str, fsdp: bool = False) -> dict:
    """The pruned parameters and per-shot report of one case, pruned by the whole group."""
    arch, settings = CASES[case]
    model = model_of(arch, fsdp)
    report = prune(model, WINDOWS, PruneConfig(**{"shots": 3, **settings}), progress=False, group=dist.group.WORLD)
    return {"params": whole(model), "sparsity": [shot.sparsity for shot in report.shots],
            "collectives": [shot.seconds.get("collectives") for shot in report.shots],
            "zero_fraction": report.zero_fraction}


def resumed(folder: Path, fsdp: bool) -> dict[str, torch.Tensor]:
    """`llama-unstructured` stopped after shot 1 on every rank, then continued from rank 0's checkpoint."""
    arch, settings = CASES["llama-unstructured"]
    config = PruneConfig(shots=3, **settings)

    def stop(shot):
        if shot.shot == 2:
            raise Stop

    with contextlib.suppress(Stop):
        prune(model_of(arch, fsdp), WINDOWS, config, progress=False, after_shot=stop,
              checkpoint=Checkpoint(folder, {"test": 1}), group=dist.group.WORLD)
    dist.barrier()
    model = model_of(arch, fsdp)
    prune(model, WINDOWS, config, progress=False, group=dist.group.WORLD,
          checkpoint=Checkpoint(folder, {"test": 1}, state=read_state(folder, {"test": 1})))
    return whole(model)


def tied_threshold(k: int) -> list[torch.Tensor]:
    """`smallest_k` over `TIED` with each rank holding only its layers' costs."""
    from surgeon.method.threshold import Elsewhere
    from surgeon.scale.distributed import Ranks

    ranks = Ranks(dist.group.WORLD, [["a"], ["b"], ["c"]])
    costs = [c if ranks.mine(name) else Elsewhere(c.numel(), c.device) for c, name in zip(TIED, "abc")]
    masks = smallest_k(costs, k, reduce=ranks.reduce())
    held = [mask() if ranks.mine(name) else torch.zeros(c.numel(), dtype=torch.bool)
            for mask, c, name in zip(masks, TIED, "abc")]
    return [ranks.sum(m.to(torch.int64)).bool() for m in held]


def refusals() -> list[str]:
    """The errors of what a group cannot run."""
    errors = []
    for settings, windows, fsdp in ((dict(lora_steps=2), WINDOWS, False), (dict(), WINDOWS[:1], False),
                                    (dict(), WINDOWS[:3], True)):
        try:
            prune(model_of("llama", fsdp), windows,
                  PruneConfig(structure="unstructured", target_size=0.5, **settings), progress=False,
                  group=dist.group.WORLD)
        except SurgeonError as error:
            errors.append(str(error))
    return errors


RECOVERY_TRAIN = torch.randint(0, 96, (8, 24), generator=torch.Generator().manual_seed(1))
RECOVERY_PRUNE = dict(structure="2:4", method="magnitude")
RECOVERY = Distill(lr=1e-3, batch_size=2)


def recovery(folder: Path, stop: int | None = None) -> dict:
    """A 2:4-pruned tiny model distilled by the whole group, both models sharded with FSDP2; with `stop`, stopped
    after that step and continued from the state each rank saved."""

    def distillation() -> tuple[torch.nn.Module, Distillation]:
        teacher, student = pruned_pair("llama", RECOVERY_PRUNE)
        for model in (teacher, student):
            shard_model(model, "cpu")
        return student, Distillation(student, teacher, RECOVERY_TRAIN, RECOVERY, dist.group.WORLD)

    student, run = distillation()
    if stop is not None:
        def after(report):
            if len(report.losses) == stop:
                torch.save(run.state(), folder / f"recovery-{dist.get_rank()}.pt")
                raise Stop

        with contextlib.suppress(Stop):
            run.run(progress=False, after_step=after)
        student, run = distillation()
        run.restore(torch.load(folder / f"recovery-{dist.get_rank()}.pt", weights_only=False))
    report = run.run(progress=False)
    return {"params": whole(student), "losses": report.losses, "masked": report.masked,
            "kept_zeros": report.kept_zeros}


def main(out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        results: dict = {case: run(case) for case in CASES}
        results["fsdp"] = {case: run(case, fsdp=True) for case in FSDP}
        results["resumed"] = {fsdp: resumed(Path(out).parent / f"resume-{fsdp}", fsdp) for fsdp in (False, True)}
        results["tied"] = {k: tied_threshold(k) for k in (3, 5, 7)}
        results["refusals"] = refusals()
        results["recovery"] = {stop: recovery(Path(out).parent, stop) for stop in (None, 2)}
        if dist.get_rank() == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
