"""The method table: every method accepted exactly where its entry says, what a run needs read from the entry, and
the CLI's help and refusals written from it."""

from __future__ import annotations

import pytest

from surgeon.config import PruneConfig
from surgeon.methods import METHODS, STRUCTURES, method_help, serving

EXAMPLE = {"structured": "structured", "coupled": "coupled", "unstructured": "unstructured", "N:M": "2:4",
           "experts": "experts"}


@pytest.mark.parametrize("kind", STRUCTURES)
@pytest.mark.parametrize("name", list(METHODS))
def test_a_method_is_accepted_exactly_for_the_structures_its_entry_serves(name, kind):
    if kind in METHODS[name].structures:
        assert PruneConfig(structure=EXAMPLE[kind], method=name).spec is METHODS[name]
        return
    with pytest.raises(ValueError) as refused:
        PruneConfig(structure=EXAMPLE[kind], method=name)
    message = str(refused.value)
    assert "\n" not in message and f"not {EXAMPLE[kind]}" in message
    assert f"for {kind} use {' or '.join(serving(kind))}" in message


def test_every_structure_is_served_and_every_method_serves_one():
    assert all(serving(kind) for kind in STRUCTURES)
    assert all(method.structures and set(method.structures) <= set(STRUCTURES) for method in METHODS.values())


def test_what_a_run_needs_follows_its_entry():
    """The pass, propagation, memory options and the held-out choice are allowed by what the entry needs."""
    for name, method in METHODS.items():
        if "N:M" in method.structures:
            assert PruneConfig(structure="2:4", method=name).propagates == method.needs_a
        if "structured" in method.structures:
            if method.needs_g:
                assert PruneConfig(structure="structured", method=name, activation_checkpointing=True)
            else:
                with pytest.raises(ValueError, match="activation_checkpointing"):
                    PruneConfig(structure="structured", method=name, activation_checkpointing=True)
        if "unstructured" in method.structures:
            config = PruneConfig(structure="unstructured", method=name)
            assert config.chooses == (method.alternative is not None)
    assert all(METHODS[m.alternative].layer_rule is not None for m in METHODS.values() if m.alternative)
    for name, method in METHODS.items():  # sampled labels need a G from the curvature pass
        kind = method.structures[0]
        if method.needs_g and kind != "experts":
            assert PruneConfig(structure=EXAMPLE[kind], method=name, fisher="sampled").fisher == "sampled"
        else:
            with pytest.raises(ValueError, match="fisher=sampled"):
                PruneConfig(structure=EXAMPLE[kind], method=name, fisher="sampled")


def test_the_coupled_damping_default_is_the_entrys():
    for name, method in METHODS.items():
        if "coupled" in method.structures:
            assert PruneConfig(structure="coupled", method=name).strengths[1] == method.coupled_damp_a


def test_the_cli_help_names_every_method_with_its_line(capsys):
    from surgeon.app.cli import main

    with pytest.raises(SystemExit):
        main(["prune", "--help"])
    shown = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
    for name, method in METHODS.items():
        assert "".join(f"{name}: {method.help} ({', '.join(method.structures)})".split()) in shown
    assert "".join(method_help().split()) in shown
