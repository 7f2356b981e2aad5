"""The multi-shot loop end to end on tiny random-init Llama and OPT models (all methods)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from surgeon import PruneConfig, prune
from surgeon.errors import SurgeonError
from surgeon.method.damping import damp
from surgeon.method.factors import by_layer
from surgeon.methods import METHODS
from surgeon.models.adapter import prunable_layers
from tests._helpers import tiny_model
from tests._tolerances import FLOAT32, assert_reaches_target, assert_within_reference_error, removed_by_rule

CASES = [
    ("structured", "surgeon"), ("structured", "magnitude"), ("structured", "lobd"), ("structured", "kobd"),
    ("unstructured", "surgeon"), ("unstructured", "magnitude"), ("unstructured", "kobd"),
    ("unstructured", "sparsegpt"), ("unstructured", "sparsegpt-exact"), ("unstructured", "sparsegpt-refine"),
    ("unstructured", "wanda"), ("2:4", "surgeon"), ("2:4", "magnitude"), ("2:4", "sparsegpt"),
    ("2:4", "sparsegpt-exact"), ("2:4", "sparsegpt-refine"), ("2:4", "wanda"),
]


def calibration(n=3, length=24, seed=0):
    return torch.randint(0, 96, (n, length), generator=torch.Generator().manual_seed(seed))


def weights(model):
    return {name: module.weight.detach().clone() for block in prunable_layers(model) for name, module in block}


def shapes(model):
    return [tuple(module.weight.shape) for block in prunable_layers(model) for _, module in block]


def assert_report_reaches_target(report, model):
    assert_reaches_target(report.removed, shapes(model), report.config["target_size"], report.config["structure"],
                          report.config["method"], sum(shot.freed for shot in report.shots))


@pytest.mark.parametrize("arch", ["llama", "opt"])
@pytest.mark.parametrize("structure,method", CASES)
def test_reaches_target_and_keeps_pruned_zero(arch, structure, method):
    model = tiny_model(arch)
    embed = model.get_input_embeddings().weight.detach().clone()
    shots = 1 if METHODS[method].layer_rule is not None and structure == "2:4" else 2
    size = None if structure == "2:4" else 0.6
    config = PruneConfig(structure=structure, target_size=size, shots=shots, method=method, max_correlate=40)
    report = prune(model, calibration(), config, progress=False)
    assert_report_reaches_target(report, model)
    assert [s.shot for s in report.shots] == list(range(1, shots + 1))
    assert torch.equal(model.get_input_embeddings().weight, embed)  # never touched
    json.dumps(report.to_dict())
    if structure == "2:4":
        for W in weights(model).values():
            assert ((W.reshape(W.shape[0], -1, 4) != 0).sum(2) <= 2).all()


@pytest.mark.parametrize("structure", ["structured", "unstructured"])
def test_pruned_weights_stay_zero_across_shots(structure):
    model = tiny_model("llama")
    zeros_after = []
    for shots in (1, 2, 3):
        config = PruneConfig(structure=structure, target_size=1 - 0.15 * shots, shots=1, method="surgeon")
        prune(model, calibration(), config, progress=False)
        zeros_after.append({k: w == 0 for k, w in weights(model).items()})
    for earlier, later in zip(zeros_after, zeros_after[1:]):
        for name in earlier:
            assert (later[name] | ~earlier[name]).all(), name


def test_surgeon_update_changes_kept_weights_and_beats_no_update():
    """On the shot's own (damped) curvature, the update lowers the quadratic loss of its mask below zeroing alone."""
    from surgeon.method import solver
    from surgeon.pruning import curvature

    base = tiny_model("llama")
    before = weights(base)
    named = [pair for block in prunable_layers(base) for pair in block]
    raw = by_layer(curvature.estimate(base, named, calibration()))  # shot 1 sees the dense model
    surgeon = tiny_model("llama")
    kobd = tiny_model("llama")
    prune(surgeon, calibration(), PruneConfig(structure="unstructured", target_size=0.7, shots=1), progress=False)
    after = weights(surgeon)
    ratios = []
    for name, _ in named:
        G = damp(raw[name].G.dense().double(), 0.1)
        A = damp(raw[name].A.dense().double(), 0.01)
        W = before[name].double()
        mask = after[name] == 0
        with_update = solver.quadratic_loss(after[name].double() - W, G, A)
        zeroed = solver.quadratic_loss(W.masked_fill(mask, 0) - W, G, A)
        ratios.append(float(with_update / zeroed))
    assert max(ratios) < 1 and sorted(ratios)[len(ratios) // 2] < 0.5  # every layer gains; most halve the loss
    prune(kobd, calibration(), PruneConfig(structure="unstructured", target_size=0.7, shots=1, method="kobd"),
          progress=False)
    kept = weights(kobd)
    assert all(torch.equal(kept[k][kept[k] != 0], before[k][kept[k] != 0]) for k in before)  # no update


def pruned_weights(**settings) -> dict[str, torch.Tensor]:
    """Tiny OPT structured to half its size in one shot: some layers lose rows and columns at once."""
    model = tiny_model("opt")
    prune(model, calibration(), PruneConfig(structure="structured", target_size=0.5, shots=1, **settings),
          progress=False)
    return weights(model)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_same_seed_is_bit_identical_and_the_seed_matters():
    """The interleaved LoRA adapters start from the seeded generator: the same seed, the same model."""
    first = pruned_weights(lora_steps=2, seed=0)
    assert same(first, pruned_weights(lora_steps=2, seed=0))
    assert not same(first, pruned_weights(lora_steps=2, seed=1))


def test_within_correlation_changes_the_result():
    assert not same(pruned_weights(), pruned_weights(correlation="within"))


def test_bad_configs():
    with pytest.raises(ValueError, match="target_size"):
        PruneConfig(target_size=1.5)
    with pytest.raises(ValueError, match="shots"):
        PruneConfig(shots=0)
    with pytest.raises(ValueError, match="structure"):
        PruneConfig(structure="4:2")
    with pytest.raises(ValueError, match="structure"):
        PruneConfig(structure="blocks")
    with pytest.raises(ValueError, match="method"):
        PruneConfig(structure="structured", method="wanda")
    model = tiny_model("llama")
    with pytest.raises(SurgeonError, match="does not divide"):
        prune(model, calibration(), PruneConfig(structure="2:7", shots=1), progress=False)


@pytest.mark.parametrize("arch", ["llama", "opt"])
@pytest.mark.parametrize("structure,method", [("structured", "surgeon"), ("coupled", "surgeon"),
                                              ("structured", "kobd")])
def test_checkpointed_offloaded_block_groups_prune_as_the_plain_pass(arch, structure, method):
    """The same factors whatever holds them: activation checkpointing, one pass per block group, host memory."""
    results = []
    for settings in ({}, dict(activation_checkpointing=True, offload=True, block_groups=2)):
        model = tiny_model(arch)
        config = PruneConfig(structure=structure, method=method, target_size=0.6, shots=2, **settings)
        report = prune(model, calibration(), config, progress=False)
        results.append((weights(model), [shot.sparsity for shot in report.shots]))
    assert same(results[0][0], results[1][0]) and results[0][1] == results[1][1]


@pytest.mark.parametrize("offload", [False, True])
def test_offload_sends_each_layers_roots_to_host_memory_and_back_for_its_update(monkeypatch, offload):
    """Each layer's G⁻¹ root, and once per input group (q/k/v, o, gate/up, down) its A⁻¹ root, go to host memory
    after the costs and come back for the updates."""
    from surgeon.method import inverses

    moves = []
    move = inverses.FactorInverse.to

    def recorded(self, device):
        moves.append(torch.device(device).type)
        return move(self, device)

    monkeypatch.setattr(inverses.FactorInverse, "to", recorded)
    model = tiny_model("llama")
    prune(model, calibration(), PruneConfig(structure="structured", target_size=0.6, shots=1, offload=offload),
          progress=False)
    blocks = prunable_layers(model)
    layers, groups = sum(len(block) for block in blocks), 4 * len(blocks)
    assert moves == (["cpu"] * 2 * (layers + groups) if offload else [])


def test_offload_and_block_groups_refuse_what_they_cannot_hold():
    with pytest.raises(ValueError, match="block_groups=2: each group's factors move to host memory"):
        PruneConfig(block_groups=2)
    with pytest.raises(ValueError, match="block_groups=0"):
        PruneConfig(block_groups=0)
    for structure in ("unstructured", "2:4"):
        with pytest.raises(ValueError, match=f"offload holds the Kronecker factors .* not of {structure} with"):
            PruneConfig(offload=True, structure=structure)
    with pytest.raises(ValueError, match="offload holds the Kronecker factors .* method magnitude"):
        PruneConfig(offload=True, method="magnitude")
    for settings in (dict(method="lobd"), dict(method="magnitude"), dict(method="wanda", structure="unstructured")):
        with pytest.raises(ValueError, match="activation_checkpointing recomputes the blocks"):
            PruneConfig(activation_checkpointing=True, **settings)
    with pytest.raises(SurgeonError, match="block_groups=3: more groups than the 2 decoder blocks the model"):
        prune(tiny_model("llama"), calibration(), PruneConfig(offload=True, block_groups=3, shots=1), progress=False)


def test_interleaved_lora_merges_and_keeps_masks():
    from torch import nn

    plain, corrected, again = tiny_model("llama"), tiny_model("llama"), tiny_model("llama")
    config = PruneConfig(structure="structured", target_size=0.7, shots=2)
    prune(plain, calibration(), config, progress=False)
    with_lora = dataclasses.replace(config, lora_steps=3, lora_lr=1e-2)
    report = prune(corrected, calibration(), with_lora, progress=False)
    torch.manual_seed(1)  # the global random state differs; the adapters start from the run's seed all the same
    prune(again, calibration(), with_lora, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(weights(corrected).values(), weights(again).values()))
    assert all("lora" in s.seconds for s in report.shots)
    a, b = weights(plain), weights(corrected)
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the correction changed weights
    for block in prunable_layers(corrected):
        for _, module in block:
            assert type(module) is nn.Linear  # adapters merged and removed
    assert_report_reaches_target(report, corrected)  # masks re-applied after merging
    assert all(p.requires_grad for p in corrected.parameters())


def pruned_by_each_backend(structure: str, max_correlate: int, dtype: torch.dtype = torch.float32) -> dict:
    """{backend: weights} of the tiny Llama pruned in one shot by each backend available here."""
    from surgeon_kernels import available_backends

    results = {}
    for backend in available_backends("cpu") if dtype == torch.float32 else ["torch"]:
        model = tiny_model("llama").to(dtype)
        config = PruneConfig(structure=structure, target_size=None if structure == "2:4" else 0.6, shots=1,
                             max_correlate=max_correlate, backend=backend)
        prune(model, calibration(n=2, length=32), config, progress=False)
        results[backend] = weights(model)
    return results


@pytest.mark.parametrize("structure", ["structured", "coupled", "unstructured", "2:4"])
def test_a_float64_model_prunes_to_the_target_and_stays_float64(structure):
    """Its factors are float64 and the layers' weights are read in float32 (`Layer.weight`): the costs meet in
    float32."""
    model = tiny_model("llama").double()
    config = PruneConfig(structure=structure, target_size=None if structure == "2:4" else 0.6, shots=2)
    report = prune(model, calibration(), config, progress=False)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert_report_reaches_target(report, model)


def test_backends_give_the_same_structured_model():
    """Structured updates solve with kept rows' and columns' factor blocks: equal up to float32 summation order."""
    results = pruned_by_each_backend("structured", 2000)
    assert len(results) >= 2  # torch plus at least the interpreted Triton kernels
    reference = results.pop("torch")
    for backend, got in results.items():
        for name, W in reference.items():
            assert torch.equal(got[name] == 0, W == 0), (backend, name)
            torch.testing.assert_close(got[name], W, **FLOAT32, msg=f"{backend} {name}")


@pytest.mark.parametrize("structure,max_correlate", [("unstructured", 0), ("unstructured", 7), ("2:4", 2000)])
def test_backends_give_the_same_element_wise_model(structure, max_correlate):
    """The same masks, and the model's weights within twice PyTorch's own float32 error of the model pruned in
    float64 (its factors held in float32): the joint solve over pruned weights (max_correlate 0) magnifies
    summation-order differences by its condition."""
    results = pruned_by_each_backend(structure, max_correlate)
    exact = pruned_by_each_backend(structure, max_correlate, torch.float64)["torch"]
    assert len(results) >= 2
    reference = results.pop("torch")
    assert all(torch.equal(exact[name] == 0, W == 0) for name, W in reference.items())  # an oracle of the same masks
    for backend, got in results.items():
        for name, W in reference.items():
            assert torch.equal(got[name] == 0, W == 0), (backend, name)
        assert_within_reference_error(torch.cat([W.flatten() for W in got.values()]),
                                      torch.cat([W.flatten() for W in exact.values()]),
                                      torch.cat([W.flatten() for W in reference.values()]))


@pytest.mark.parametrize("method", ["sparsegpt", "sparsegpt-refine", "wanda"])
def test_a_nan_weight_is_named_not_pruned(method):
    """The last block's down_proj reads finite inputs, so only the weight check can find its NaN."""
    model = tiny_model("llama")
    with torch.no_grad():
        model.model.layers[-1].mlp.down_proj.weight[0, 1] = float("nan")
    with pytest.raises(SurgeonError, match=r"^NaN or infinity in the weights of layer \S*layers\.1\.mlp\.down_proj;"):
        prune(model, calibration(), PruneConfig(structure="unstructured", target_size=0.5, shots=1, method=method),
              progress=False)


@pytest.mark.parametrize("structure", ["unstructured", "2:4"])
def test_sparsegpt_exact_and_refine_keep_sparsegpts_mask_and_lower_its_error(structure):
    """In the first block (same inputs for all), the same mask and a lower output error ½ tr(ΔW A ΔWᵀ) per layer."""
    from surgeon.pruning import curvature

    dense, ids = tiny_model("llama"), calibration()
    first = prunable_layers(dense)[0]
    A = {name: f.A.dense() for name, f in by_layer(curvature.estimate(dense, first, ids, need_g=False)).items()}
    before = weights(dense)
    pruned = {}
    for method in ("sparsegpt", "sparsegpt-exact", "sparsegpt-refine"):
        model = tiny_model("llama")
        prune(model, ids, PruneConfig(structure=structure, target_size=None if structure == "2:4" else 0.5, shots=1,
                                      method=method), progress=False)
        pruned[method] = weights(model)
    for name, _ in first:
        theirs = pruned["sparsegpt"][name]
        for ours in (pruned["sparsegpt-exact"][name], pruned["sparsegpt-refine"][name]):
            assert torch.equal(theirs == 0, ours == 0), name
            errors = [float(((before[name] - W) @ A[name] * (before[name] - W)).sum()) for W in (theirs, ours)]
            assert errors[1] < errors[0], name


def test_every_phase_of_a_run_shows_its_progress(monkeypatch):
    """Curvature, costs, threshold, updates, interleaved LoRA, the held-out alternative and its losses each have a
    progress bar of their own."""
    from tqdm.auto import tqdm

    from surgeon.pruning import curvature, elements, report, shots

    shown = []

    def recorded(iterable=None, *args, desc=None, disable=False, **kwargs):
        if not disable:
            shown.append(desc)
        return tqdm(iterable, *args, desc=desc, disable=True, **kwargs)

    for module in (curvature, elements, report, shots):
        monkeypatch.setattr(module, "tqdm", recorded)
    prune(tiny_model("llama"), calibration(), PruneConfig(structure="structured", target_size=0.7, shots=1,
                                                          lora_steps=1))
    prune(tiny_model("llama"), calibration(), PruneConfig(structure="unstructured", target_size=0.5, shots=1),
          held_out_ids=calibration(seed=1)[:2])
    phases = {"shot 1/1 · " + phase for phase in ("curvature", "costs", "updates", "LoRA",
                                                  "threshold (layers' costs read)")}
    assert phases | {"shots", "blocks (layers pruned)", "block inputs (batches, twice)", "held-out loss"} \
        <= set(shown), shown


@pytest.mark.parametrize("structure", ["2:4", "unstructured"])
def test_a_block_by_block_pass_counts_each_blocks_two_runs_over_the_batches(structure, monkeypatch):
    """Below the layers pruned, a bar counts each block's runs over its batches (its inputs' factors, then the next
    block's inputs), which at the CLI's calibration budget take minutes on a wide block: it reaches its total."""
    from surgeon.pruning import elements

    bars = []

    class Recorded:  # a bar that counts its updates
        def __init__(self, *, total: int, desc: str, **kwargs):
            self.total, self.desc, self.n = total, desc, 0
            bars.append(self)

        def update(self, n: int = 1) -> None:
            self.n += n

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

    monkeypatch.setattr(elements, "tqdm", Recorded)
    model, ids = tiny_model("llama"), calibration()
    method = "surgeon" if structure == "2:4" else "sparsegpt"
    prune(model, ids, PruneConfig(structure=structure, method=method, shots=1), progress=True)
    runs = [bar for bar in bars if bar.desc == "block inputs (batches, twice)"]
    assert len(runs) == len(prunable_layers(model)) and all(bar.n == bar.total == 2 * len(ids) for bar in runs)


@pytest.mark.parametrize("structure", ["unstructured", "structured", "2:4"])
def test_a_shot_inverts_each_inputs_a_once_for_the_layers_that_read_it(structure, monkeypatch):
    """q/k/v and gate/up read one input each: a shot inverts 4 A's per Llama block for its 7 layers."""
    from surgeon.method import inverses

    calls = []
    input_inverse = inverses.input_inverse
    monkeypatch.setattr(inverses, "input_inverse",
                        lambda *args, **kwargs: calls.append(1) or input_inverse(*args, **kwargs))
    model = tiny_model("llama")
    target = None if structure == "2:4" else 0.7
    prune(model, calibration(), PruneConfig(structure=structure, target_size=target, shots=1), progress=False)
    assert len(calls) == 4 * len(prunable_layers(model))


@pytest.mark.parametrize("method", [name for name, method in METHODS.items() if method.layer_rule is not None])
def test_per_layer_methods_see_inputs_of_pruned_blocks(method, monkeypatch):
    from surgeon.pruning import curvature

    model = tiny_model("llama")
    blocks = prunable_layers(model)
    ids = calibration()
    seen = []
    estimate_inputs = curvature.estimate_inputs

    def recording(layers, *args, **kwargs):
        seen.append([int((module.weight == 0).sum()) for block in blocks for _, module in block])
        groups = estimate_inputs(layers, *args, **kwargs)
        blockwise = by_layer(groups)
        whole = by_layer(curvature.estimate(model, layers, ids, need_g=False))  # the model now, from the embeddings
        for name, _ in layers:
            torch.testing.assert_close(blockwise[name].A.dense(), whole[name].A.dense(), **FLOAT32)
        return groups

    monkeypatch.setattr(curvature, "estimate_inputs", recording)
    prune(model, ids, PruneConfig(structure="unstructured", target_size=0.5, shots=1, method=method), progress=False)
    per_block = [len(b) for b in blocks]
    assert len(seen) == len(blocks)
    for index, zeros in enumerate(seen):
        done = sum(per_block[:index])
        expected = [removed_by_rule([shape], 0.5, method) for shape in shapes(model)[:done]]
        assert zeros[:done] == expected  # earlier blocks already pruned
        assert all(count == 0 for count in zeros[done:])  # this and later blocks still dense


@pytest.mark.parametrize("structure", ["structured", "unstructured"])
def test_non_finite_update_is_retried_with_more_damping(structure, monkeypatch, caplog):
    from surgeon.method import updates

    real, calls = getattr(updates, structure), []

    def first_call_fails(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        return torch.full_like(out, float("nan")) if len(calls) == 1 else out

    monkeypatch.setattr(updates, structure, first_call_fails)
    model = tiny_model("llama")
    report = prune(model, calibration(), PruneConfig(structure=structure, target_size=0.7, shots=1), progress=False)
    assert "retrying with damping 1\n" in caplog.text + "\n"  # 10 × max(λ_G, λ_A) = 10 × 0.1
    assert all(torch.isfinite(W).all() for W in weights(model).values())
    assert_report_reaches_target(report, model)


def test_update_that_stays_non_finite_is_refused(monkeypatch):
    from surgeon.method import updates

    monkeypatch.setattr(updates, "unstructured", lambda W, *a, **k: torch.full_like(W, float("nan")))
    model = tiny_model("llama")
    with pytest.raises(SurgeonError, match="non-finite weights computed for layer"):
        prune(model, calibration(), PruneConfig(structure="unstructured", target_size=0.7, shots=1), progress=False)
    assert all(torch.isfinite(W).all() for W in weights(model).values())


@pytest.mark.parametrize("structure", ["structured", "unstructured"])
@pytest.mark.parametrize("method", ["surgeon", "kobd"])
def test_structures_with_zero_curvature_go_first(structure, method):
    """MLP channels cut at down_proj have zero output gradient in gate/up: costs 0, taken first."""
    model = tiny_model("llama")
    mlp = model.model.layers[0].mlp
    dead = torch.tensor([2, 5, 11])
    mlp.down_proj.weight.data[:, dead] = 0
    total = sum(m.weight.numel() for block in prunable_layers(model) for _, m in block)
    already = mlp.down_proj.weight.shape[0] * dead.numel()
    freed = 2 * mlp.gate_proj.weight.shape[1] * dead.numel()  # the gate and up rows of the cut channels
    size = 1 - (already + freed) / total  # exactly those rows must go, if their cost is 0
    prune(model, calibration(), PruneConfig(structure=structure, target_size=size, shots=1, method=method),
          progress=False)
    for layer in (mlp.gate_proj, mlp.up_proj):
        pruned = (layer.weight == 0).all(1).nonzero().squeeze(1)
        assert torch.equal(pruned, dead) and int((layer.weight == 0).sum()) == dead.numel() * layer.weight.shape[1]


@pytest.mark.parametrize("arch", ["llama", "opt"])
@pytest.mark.parametrize("method", ["surgeon", "kobd"])
def test_element_shot_removes_the_weights_of_least_cost(arch, method):
    """One unstructured shot removes the weights of least eq.-7 cost over the model, as computed here from
    the damped factors (the shot computes its costs when the threshold reads them)."""
    from surgeon.method import solver
    from surgeon.pruning import curvature

    model = tiny_model(arch)
    config = PruneConfig(structure="unstructured", target_size=0.7, shots=1, method=method)
    named = [pair for block in prunable_layers(model) for pair in block]
    raw = by_layer(curvature.estimate(model, named, calibration()))
    costs = {}
    for name, module in named:
        W = module.weight.detach().double()
        if module.bias is not None:
            W = torch.cat([W, module.bias.detach().double().unsqueeze(1)], 1)
        G = damp(raw[name].G.dense().double(), config.strengths[0])
        A = damp(raw[name].A.dense().double(), config.strengths[1])
        e = solver.element_costs(W, G, A) if method == "surgeon" else 0.5 * W.square() * torch.outer(G.diag(), A.diag())
        costs[name] = e[:, : module.in_features]
    flat = torch.cat([e.reshape(-1) for e in costs.values()])
    tau = float(torch.kthvalue(flat, round(0.3 * flat.numel())).values)
    prune(model, calibration(), config, progress=False)
    for name, module in named:
        wrong = (module.weight == 0) != (costs[name] <= tau)
        torch.testing.assert_close(costs[name][wrong], torch.full_like(costs[name][wrong], tau), **FLOAT32)


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_structured_costs_from_the_pass_equal_the_costs_from_the_factors(arch):
    """After a shot (rows and columns removed, OPT biases), the pass's numerators give eq. 7 (float32)."""
    from surgeon.method import costs, inverses, solver
    from surgeon.method.submatrix import submatrix
    from surgeon.pruning import curvature

    model = tiny_model(arch)
    prune(model, calibration(), PruneConfig(structure="structured", target_size=0.75, shots=1), progress=False)
    named = [pair for block in prunable_layers(model) for pair in block]
    raw = by_layer(curvature.estimate(model, named, calibration(seed=1)))
    strengths = (0.5, 0.5)  # strong damping: its algebra shows
    removed = 0
    for name, module in named:
        W = module.weight.detach()
        if module.bias is not None:
            W = torch.cat([W, module.bias.detach().unsqueeze(1)], 1)
        keep_r = (W != 0).any(1).nonzero().squeeze(1)
        keep_c = (W != 0).any(0).nonzero().squeeze(1)
        removed += (W.shape[0] - keep_r.numel()) + (W.shape[1] - keep_c.numel())
        f = inverses.kronecker(inverses.output_inverse(raw[name], keep_r, strengths[0], root=True),
                               inverses.input_inverse(raw[name].A, keep_c, strengths[1], root=True))
        real = int((keep_c < module.in_features).sum())
        rows, cols = costs.layer_structure_costs(W, raw[name], f, keep_r, keep_c, real, strengths)
        sub = submatrix(W, keep_r, keep_c)
        G = damp(submatrix(raw[name].G.dense(), keep_r, keep_r), strengths[0])
        A = damp(submatrix(raw[name].A.dense(), keep_c, keep_c), strengths[1])
        torch.testing.assert_close(rows, solver.row_costs(sub, G, A), **FLOAT32)
        torch.testing.assert_close(cols, solver.col_costs(sub, G, A)[:real], **FLOAT32)
    assert removed > 0


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_conjugate_gradients_in_bfloat16_prune_to_the_target(arch):
    """cg_dtype: the update's products in bfloat16 reach the target with finite weights near, not equal to,
    float32's; a solve it cannot run is refused. One threshold over all layers: under a layer's limits a cost that
    bfloat16 moves can move a weight between layers, which says nothing of the products' precision."""
    config = PruneConfig(structure="unstructured", target_size=0.5, shots=2, layer_deviation=1)
    plain, low = tiny_model(arch), tiny_model(arch)
    prune(plain, calibration(), config, progress=False)
    report = prune(low, calibration(), dataclasses.replace(config, cg_dtype="bfloat16"), progress=False)
    assert_report_reaches_target(report, low)
    a, b = weights(plain), weights(low)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    difference = sum(float((b[k] - a[k]).square().sum()) for k in a) ** 0.5
    assert difference <= 0.05 * sum(float(a[k].square().sum()) for k in a) ** 0.5
    with pytest.raises(ValueError, match="cg_dtype"):
        PruneConfig(structure="unstructured", cg_dtype="int8")
    with pytest.raises(ValueError, match="cg_dtype sets the precision"):
        PruneConfig(structure="unstructured", cg_dtype="bfloat16", max_correlate=64)


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_the_propagated_last_nm_shot_prunes_later_blocks_on_pruned_inputs(arch):
    """Block 0's inputs are the embeddings, which no pruning changes: it prunes as in the unpropagated shot.
    Block 1's A comes from block 0 as pruned and updated: its weights differ. Every group keeps 2 of 4."""
    config = PruneConfig(structure="2:4", shots=2, propagate=False, damp_g=0.1,
                         nm_mask="costs")  # λ_G and the mask rule given: the same in both
    plain, propagated = tiny_model(arch), tiny_model(arch)
    prune(plain, calibration(), config, progress=False)
    prune(propagated, calibration(), dataclasses.replace(config, propagate=True), progress=False)
    a, b = weights(plain), weights(propagated)
    for name, value in b.items():
        assert bool(((value == 0).reshape(value.shape[0], -1, 4).sum(-1) >= 2).all()), name
        if ".0." in name:
            torch.testing.assert_close(value, a[name], **FLOAT32)
    assert any(not torch.allclose(value, a[name]) for name, value in b.items() if ".1." in name)


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_the_propagated_last_unstructured_shot_keeps_the_global_thresholds_count_per_layer(arch):
    """Each layer loses as many weights as the shot's global threshold takes from it, chosen by its costs on the
    inputs of the blocks already pruned: block 0, on the embeddings, prunes as the unpropagated shot; block 1
    differs."""
    config = PruneConfig(structure="unstructured", target_size=0.6, shots=2, propagate=False, damp_g=0.1)
    plain, propagated = tiny_model(arch), tiny_model(arch)
    prune(plain, calibration(), config, progress=False)
    report = prune(propagated, calibration(), dataclasses.replace(config, propagate=True), progress=False)
    a, b = weights(plain), weights(propagated)
    assert report.sparsity == pytest.approx(0.4, abs=1e-3)
    for name, value in b.items():
        assert int((value == 0).sum()) == int((a[name] == 0).sum()), name
        if "layers.0." in name:
            torch.testing.assert_close(value, a[name], **FLOAT32)
    assert any(not torch.allclose(value, a[name]) for name, value in b.items() if "layers.1." in name)


@pytest.mark.parametrize("propagate", [False, True])
@pytest.mark.parametrize("deviation", [0.0, 0.02])
def test_a_layer_deviation_bounds_every_layers_sparsity_where_the_global_threshold_does_not(deviation, propagate):
    """Each shot takes from every layer the shot's fraction of its weights to within `layer_deviation` (and one
    weight), by the costs, the propagated last shot included; the global threshold (deviation 1) strays further."""
    config = PruneConfig(structure="unstructured", target_size=0.6, shots=2, propagate=propagate, layer_deviation=1)
    spread, bounded = tiny_model("llama"), tiny_model("llama")
    prune(spread, calibration(), config, progress=False)
    report = prune(bounded, calibration(), dataclasses.replace(config, layer_deviation=deviation), progress=False)
    assert report.sparsity == pytest.approx(0.4, abs=1e-3)
    strays = {name: abs(float((value == 0).float().mean()) - 0.4) - 1 / value.numel()
              for name, value in weights(bounded).items()}
    assert max(strays.values()) <= deviation + 1e-6, strays
    assert max(abs(float((value == 0).float().mean()) - 0.4) for value in weights(spread).values()) > 0.05


def test_a_layer_deviation_is_refused_where_no_global_threshold_parts_an_unstructured_shot():
    for settings in (dict(structure="2:4"), dict(structure="structured"), dict(method="sparsegpt")):
        with pytest.raises(ValueError, match="layer_deviation bounds"):
            PruneConfig(**{"structure": "unstructured", **settings, "layer_deviation": 0.1})
    for method in ("surgeon", "kobd", "lobd", "magnitude"):  # every method the global threshold serves
        assert PruneConfig(structure="unstructured", method=method, layer_deviation=0.0).layer_deviation == 0.0
    with pytest.raises(ValueError, match="layer_deviation=-0.1: must be at least 0"):
        PruneConfig(structure="unstructured", layer_deviation=-0.1)


def test_a_counted_selection_takes_each_layers_cheapest_weights_those_pruned_first():
    from surgeon.models.layer import Layer
    from surgeon.pruning.elements import counted_selection

    layer = Layer.unpruned("x", torch.nn.Linear(4, 2), elements=True)
    costs = torch.tensor([[3.0, float("-inf"), 1.0, 5.0], [0.5, 4.0, 2.0, 6.0]])
    assert counted_selection({"x": 3}, "torch")(layer, lambda: costs, None).tolist() == [[False, True, True, False],
                                                                                       [True, False, False, False]]


def test_an_nm_selection_takes_the_sweeps_mask_or_the_cheapest_by_the_costs():
    """`nm_mask`: sweep, SparseGPT's mask on the layer's A with the same damping; costs, the cheapest 2 of every 4 by
    eq. 7 (the costs read only by that rule)."""
    from surgeon.method import baselines
    from surgeon.models.layer import Layer
    from surgeon.pruning.elements import nm_selection
    from surgeon_kernels.ops import PackedSymmetric

    torch.manual_seed(0)
    layer = Layer.unpruned("x", torch.nn.Linear(8, 6, bias=False), elements=True)
    X = torch.randn(64, 8) * torch.linspace(0.2, 3, 8)
    A, costs = X.T @ X, torch.rand(6, 8)
    swept = baselines.sparsegpt(layer.weight(), A, 0.5, layer.mask, (2, 4), percdamp=0.05)[1]
    by_costs = costs.view(6, 2, 4).argsort(-1).argsort(-1).lt(2).view(6, 8)
    assert not torch.equal(by_costs, swept)  # the two rules differ here, so each assertion tells them apart

    def unread() -> torch.Tensor:
        raise AssertionError("the sweep reads no costs")

    packed = PackedSymmetric.pack(A)
    assert torch.equal(nm_selection((2, 4), "torch", "costs", 0.05)(layer, lambda: costs, packed), by_costs)
    assert torch.equal(nm_selection((2, 4), "torch", "sweep", 0.05)(layer, unread, packed), swept)


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_the_sweeps_nm_masks_are_sparsegpts_on_the_first_block_and_n_of_m_everywhere(arch):
    """Block 0 reads the embeddings, which no pruning changes, and each of its layers is chosen from its dense weights:
    there LLM Surgeon's masks, swept by default, are SparseGPT's, and by eq. 7's costs differ; every layer of a run
    with either rule keeps 2 of every 4."""
    def masks(model):
        return {name: W == 0 for name, W in weights(model).items()}

    sparsegpt, swept, by_costs = tiny_model(arch), tiny_model(arch), tiny_model(arch)
    prune(sparsegpt, calibration(), PruneConfig(structure="2:4", method="sparsegpt"), progress=False)
    prune(swept, calibration(), PruneConfig(structure="2:4", held_out_choice=False), progress=False)
    prune(by_costs, calibration(), PruneConfig(structure="2:4", nm_mask="costs", held_out_choice=False), progress=False)
    first = [name for name, _ in prunable_layers(swept)[0]]
    assert all(torch.equal(masks(swept)[name], masks(sparsegpt)[name]) for name in first)
    assert not any(torch.equal(masks(by_costs)[name], masks(sparsegpt)[name]) for name in first)
    for model in (swept, by_costs):
        assert all(m.view(m.shape[0], -1, 4).sum(-1).eq(2).all() for m in masks(model).values())


def test_nm_masks_are_swept_where_a_correlated_methods_nm_shot_propagates_and_refused_elsewhere():
    assert PruneConfig(structure="2:4").mask_rule == "sweep" == PruneConfig(structure="4:8").resolved()["nm_mask"]
    for settings in (dict(structure="unstructured"), dict(structure="2:4", method="sparsegpt"),
                     dict(structure="2:4", propagate=False), dict(structure="2:4", method="kobd")):
        assert PruneConfig(**settings).mask_rule == "costs" == PruneConfig(**settings, nm_mask="costs").mask_rule
        with pytest.raises(ValueError, match="nm_mask=sweep: the propagated N:M shot of a correlated method"):
            PruneConfig(**settings, nm_mask="sweep")


def test_nm_defaults_to_one_propagated_shot_with_stronger_damping_of_g():
    """N:M's defaults are the measured best (bench/RESULTS.md); other structures keep theirs; given values stay."""
    nm = PruneConfig(structure="2:4")
    assert (nm.shot_count, nm.propagates, nm.strengths) == (1, True, (1.0, 0.01))
    assert PruneConfig(structure="4:8", method="kobd").propagates
    for structure, shots in (("unstructured", 2), ("structured", 4), ("coupled", 4)):  # the measured frontier
        config = PruneConfig(structure=structure)
        assert (config.shot_count, config.propagates, config.strengths[0]) == (shots, False, 0.1)
    for config in (PruneConfig(structure="2:4", method="sparsegpt"), PruneConfig(structure="2:4", method="magnitude")):
        assert config.shot_count == 1 and not config.propagates and config.strengths[0] == 0.1
    given = PruneConfig(structure="2:4", shots=4, propagate=False, damp_g=0.3)
    assert (given.shot_count, given.propagates, given.strengths[0]) == (4, False, 0.3)
    assert dataclasses.replace(given, propagate=True).strengths[0] == 0.3  # a given value stays given


@pytest.mark.parametrize("structure", ["2:4", "unstructured"])
def test_the_run_is_weighed_against_sparsegpt_refine_and_keeps_the_lower_held_out_loss(structure):
    """held_out_choice prunes the dense model with sparsegpt-refine in one shot and with LLM Surgeon, and keeps the
    one with the lower loss on the held-out windows: the result is, bit for bit, that run alone; without held-out
    windows, LLM Surgeon's."""
    from surgeon.pruning.held_out import held_out_loss

    ids, held = calibration(), calibration(seed=1)
    target = {"target_size": 0.5} if structure == "unstructured" else {}
    runs = {"surgeon": PruneConfig(structure=structure, held_out_choice=False, **target),
            "sparsegpt-refine": PruneConfig(structure=structure, method="sparsegpt-refine", shots=1, **target)}
    alone = {}
    for method, config in runs.items():
        model = tiny_model("llama")
        report = prune(model, ids, config, progress=False, held_out_ids=held)
        assert report.choice is None and report.config["held_out_choice"] is False
        alone[method] = (weights(model), held_out_loss(model, held, 1))
    assert any(not torch.equal(a, alone["sparsegpt-refine"][0][name]) for name, a in alone["surgeon"][0].items())
    model = tiny_model("llama")
    report = prune(model, ids, PruneConfig(structure=structure, **target), progress=False, held_out_ids=held)
    assert report.config["held_out_choice"] is True and report.choice["seconds"] > 0
    losses = report.choice["held_out_loss"]
    assert losses == pytest.approx({method: loss for method, (_, loss) in alone.items()}, rel=1e-6)
    assert report.choice["kept"] == min(losses, key=losses.__getitem__)
    assert all(torch.equal(value, alone[report.choice["kept"]][0][name]) for name, value in weights(model).items())
    unheld = tiny_model("llama")
    assert prune(unheld, ids, PruneConfig(structure=structure, **target), progress=False).choice is None
    assert all(torch.equal(value, alone["surgeon"][0][name]) for name, value in weights(unheld).items())


@pytest.mark.parametrize("kept", ["surgeon", "sparsegpt-refine"])
def test_the_held_out_choice_keeps_either_model_when_its_loss_is_lower(kept, monkeypatch):
    from surgeon.pruning import held_out

    ids = calibration()
    alone = tiny_model("llama")
    prune(alone, ids, PruneConfig(structure="2:4", held_out_choice=False) if kept == "surgeon"
          else PruneConfig(structure="2:4", method="sparsegpt-refine"), progress=False)
    losses = iter([2.0, 1.0] if kept == "surgeon" else [1.0, 2.0])  # sparsegpt-refine is scored first
    monkeypatch.setattr(held_out, "held_out_loss", lambda *args: next(losses))
    model = tiny_model("llama")
    report = prune(model, ids, PruneConfig(structure="2:4"), progress=False, held_out_ids=calibration(seed=1))
    assert report.choice["kept"] == kept
    expected = weights(alone)
    assert all(torch.equal(value, expected[name]) for name, value in weights(model).items())


def test_the_held_out_choice_is_for_unstructured_and_nm_surgeon():
    assert PruneConfig(structure="2:4").chooses and PruneConfig(structure="unstructured").chooses
    assert PruneConfig(structure="2:4", shots=4, propagate=False).chooses
    assert not PruneConfig(structure="structured").chooses
    assert not PruneConfig(structure="2:4", method="sparsegpt", shots=1).chooses
    assert not PruneConfig(structure="unstructured", held_out_choice=False).chooses
    for config in (dict(structure="structured"), dict(structure="2:4", method="kobd")):
        with pytest.raises(ValueError, match="held_out_choice weighs an unstructured or N:M run"):
            PruneConfig(held_out_choice=True, **config)


def test_replace_resolves_the_defaults_again():
    """A field left at its default is resolved for the structure it ends with, so `replace` keeps working, and
    `resolved()` shows every value the run uses."""
    config = PruneConfig()
    assert (config.target_size, config.shots, config.propagate, config.damp_g) == (None, None, None, None)
    nm = dataclasses.replace(config, structure="2:4")  # no target_size of 0.8 carried over to refuse 2:4
    assert (nm.target, nm.shot_count, nm.propagates, nm.strengths) == (0.5, 1, True, (1.0, 0.01))
    back = dataclasses.replace(nm, structure="coupled")
    assert (back.target, back.shot_count, back.propagates, back.strengths) == (0.8, 4, False, (0.1, 0.3))
    assert {key: back.resolved()[key] for key in ("target_size", "shots", "propagate", "damp_g", "damp_a")} == \
        {"target_size": 0.8, "shots": 4, "propagate": False, "damp_g": 0.1, "damp_a": 0.3}


def test_coupled_surgeon_damps_a_more_by_default():
    """Coupled LLM Surgeon's λ_A default is its measured best (bench/RESULTS.md); its baselines keep 0.01."""
    assert PruneConfig(structure="coupled").strengths == (0.1, 0.3)
    assert PruneConfig(structure="coupled", method="kobd").strengths == (0.1, 0.01)
    assert PruneConfig(structure="coupled", damp_a=0.05).strengths == (0.1, 0.05)


def test_propagate_needs_an_element_structure():
    with pytest.raises(ValueError, match="propagate prunes the last element shot"):
        PruneConfig(structure="structured", target_size=0.5, propagate=True)
    assert PruneConfig(structure="unstructured", propagate=True).propagates
    with pytest.raises(ValueError, match="propagate"):
        PruneConfig(structure="2:4", method="sparsegpt", shots=1, propagate=True)
