"""Whether two commits prune alike: the same settings on the same tiny random models, compared weight by weight.

A change meant to preserve behaviour (a refactor) must give bit-identical pruned weights and held-out choices on
every kind of run: structured, coupled, unstructured and N:M defaults with their held-out choice, every baseline,
offload with block groups, interleaved LoRA and whole experts. Tiny models make this a one-minute check on any
machine, where the quality table's rows also move with the machine's arithmetic (bench/RESULTS.md).

    python -m bench.quality.same_models --base 2aef058      # the working tree against that commit
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
CASES = {  # name -> (tiny model, PruneConfig settings)
    "unstructured-default": ("llama", dict(structure="unstructured", target_size=0.5)),
    "2:4-default": ("llama", dict(structure="2:4")),
    "4:8-default-opt": ("opt", dict(structure="4:8")),
    "structured-default": ("llama", dict(structure="structured", target_size=0.6)),
    "structured-within-opt": ("opt", dict(structure="structured", target_size=0.7, correlation="within")),
    "coupled": ("llama", dict(structure="coupled", target_size=0.7)),
    "coupled-kobd-opt": ("opt", dict(structure="coupled", target_size=0.7, method="kobd")),
    "wanda": ("llama", dict(structure="unstructured", target_size=0.5, method="wanda", shots=1)),
    "sparsegpt-2:4": ("llama", dict(structure="2:4", method="sparsegpt", shots=1)),
    "sparsegpt-refine": ("llama", dict(structure="unstructured", target_size=0.5, method="sparsegpt-refine", shots=1)),
    "sparsegpt-exact-2:4": ("llama", dict(structure="2:4", method="sparsegpt-exact", shots=1)),
    "unstructured-m4": ("llama", dict(structure="unstructured", target_size=0.5, max_correlate=4)),
    "structured-offload": ("llama", dict(structure="structured", target_size=0.6, offload=True, block_groups=2)),
    "structured-lora": ("llama", dict(structure="structured", target_size=0.6, lora_steps=2)),
    "magnitude-opt": ("opt", dict(structure="unstructured", target_size=0.5, method="magnitude")),
    "lobd-2:4": ("llama", dict(structure="2:4", method="lobd")),
    "experts-surgeon": ("mixtral", dict(structure="experts", target_size=0.5, shots=2)),
    "experts-reap": ("mixtral", dict(structure="experts", target_size=0.5, shots=2, method="reap")),
}


def prune_all(output: Path) -> None:
    """Prune every case with the `surgeon` on the import path and save the weights and held-out choices."""
    import surgeon
    from surgeon import PruneConfig, prune
    from tests._families import VOCAB, family_model
    from tests._helpers import tiny_model

    windows = torch.randint(0, 96, (8, 24), generator=torch.Generator().manual_seed(0))
    held_out = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(1))
    routed = torch.randint(3, VOCAB, (4, 32), generator=torch.Generator().manual_seed(0))
    out = {}
    for name, (arch, settings) in CASES.items():
        model = family_model(arch) if arch == "mixtral" else tiny_model(arch)
        try:
            report = prune(model, routed if arch == "mixtral" else windows, PruneConfig(**settings), progress=False,
                           held_out_ids=None if arch == "mixtral" else held_out)
        except Exception as error:  # noqa: BLE001 - an older commit may not know a setting: said, not fatal
            out[name] = f"{type(error).__name__}: {error}"
            continue
        choice = {key: value for key, value in (report.choice or {}).items() if key != "seconds"}
        out[name] = ({key: value.clone() for key, value in model.state_dict().items()}, choice)
    torch.save(out, output)
    print(f"pruned with {Path(surgeon.__file__).parent}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the commit to compare the working tree with")
    parser.add_argument("--prune-into", type=Path, help=argparse.SUPPRESS)  # one side's run, in a subprocess
    args = parser.parse_args()
    if args.prune_into is not None:
        prune_all(args.prune_into)
        return
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.base], cwd=ROOT, check=True)
        try:
            for built in ROOT.glob("surgeon_kernels/_C*.so"):  # the compiled ops, as the working tree has them
                (base / "surgeon_kernels" / built.name).write_bytes(built.read_bytes())
            for shared in ("tests", "bench"):  # the tiny models and this script: the working tree's, on both sides
                shutil.rmtree(base / shared, ignore_errors=True)
            results = {}
            for side, tree in (("base", base), ("head", ROOT)):
                path = Path(scratch) / f"{side}.pt"
                env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}"}  # that side's surgeon first
                subprocess.run([sys.executable, __file__, "--base", args.base, "--prune-into", str(path)],
                               cwd=scratch, env=env, check=True)
                results[side] = torch.load(path)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=True)
    differ = 0
    for name in CASES:
        base_run, head_run = results["base"][name], results["head"][name]
        if isinstance(base_run, str) or isinstance(head_run, str):
            differ += 1
            print(f"{name}: not run at {'the base' if isinstance(base_run, str) else 'the working tree'} "
                  f"({base_run if isinstance(base_run, str) else head_run})")
            continue
        (before, choice_before), (after, choice_after) = base_run, head_run
        same = before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
        differ += not (same and choice_before == choice_after)
        print(f"{name}: {'same weights' if same else 'weights differ'}, "
              f"{'same' if choice_before == choice_after else 'different'} held-out choice")
    print(f"{len(CASES) - differ} of {len(CASES)} settings prune alike at {args.base} and the working tree")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
