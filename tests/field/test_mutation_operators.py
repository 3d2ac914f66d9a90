"""The field lane's mutation operators on a small module written here: each finds its
sites, changes exactly one, keeps every line number, and the mutant still compiles.
Runs in the ordinary suite (no field package needed)."""

from __future__ import annotations

import ast
import linecache
import sys
import textwrap
from pathlib import Path

import pytest

from tests.field import _mutants, _verdicts

SOURCE = textwrap.dedent(
    """\
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu


    def kernel(x_hbm, o_hbm, buf, sems, send_sem, recv_sem, n):
        me = 0
        slot = 0
        next_slot = 1 - slot
        right = (me + 1) % n
        pltpu.make_async_copy(x_hbm, buf.at[next_slot], sems.at[next_slot]).start()
        pltpu.make_async_copy(x_hbm, buf.at[slot], sems.at[slot]).wait()
        barrier = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(barrier, 1, device_id=right)
        pl.semaphore_wait(barrier, 1)
        copy = pltpu.make_async_remote_copy(buf.at[0], o_hbm, send_sem, recv_sem, device_id=right)
        copy.start()
        copy.wait()

        @pl.when(me == 0)
        def _():
            pltpu.make_async_copy(x_hbm, buf.at[0], sems.at[0]).start()

        pltpu.async_copy(x_hbm, buf.at[1], sems.at[1]).wait()
        pltpu.make_async_copy(
            x_hbm, buf.at[0], sems.at[0]
        ).wait()
    """
)


@pytest.fixture
def module_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "field_operator_probe.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "field_operator_probe"
    sys.modules.pop("field_operator_probe", None)


def _changed_lines(module_name: str, mutant: _mutants.Mutant) -> set[int]:
    """The lines whose text differs between the original and the mutant's source."""
    path = _mutants.source_path(module_name)
    tree = ast.parse(path.read_text())
    mutated = _mutants.mutated_tree(module_name, mutant)

    def by_line(root: ast.AST) -> dict[int, list[str]]:
        lines: dict[int, list[str]] = {}
        for node in ast.walk(root):
            if isinstance(node, (ast.stmt, ast.expr)):
                lines.setdefault(node.lineno, []).append(ast.dump(node))
        return lines

    before, after = by_line(tree), by_line(mutated)
    return {line for line in before.keys() | after.keys() if before.get(line) != after.get(line)}


def test_every_operator_finds_a_site_in_the_probe(module_name: str) -> None:
    found = {m.operator for m in _mutants.mutants_of(module_name)}
    assert found == set(_mutants.OPERATORS), set(_mutants.OPERATORS) - found


@pytest.mark.parametrize("operator", _mutants.OPERATORS)
def test_a_mutant_changes_its_own_line_and_compiles(module_name: str, operator: str) -> None:
    for mutant in (m for m in _mutants.mutants_of(module_name) if m.operator == operator):
        module = _mutants.mutated_module(module_name, mutant)
        assert callable(module.kernel)
        assert module.kernel.__code__.co_filename == str(_mutants.source_path(module_name))
        changed = _changed_lines(module_name, mutant)
        assert mutant.line in changed, (mutant, changed)


def test_dropping_a_start_and_wait_keeps_the_start(module_name: str) -> None:
    line = (
        SOURCE.splitlines().index("    pltpu.async_copy(x_hbm, buf.at[1], sems.at[1]).wait()") + 1
    )
    mutant = next(
        m
        for m in _mutants.mutants_of(module_name, 99)
        if m.operator == "drop_wait" and m.line == line
    )
    text = ast.unparse(_mutants.mutated_tree(module_name, mutant))
    assert "pltpu.async_copy(x_hbm, buf.at[1], sems.at[1])\n" in text + "\n"
    assert "sems.at[1]).wait()" not in text


def test_a_wait_only_descriptor_moves_to_the_next_slot(module_name: str) -> None:
    mutant = next(m for m in _mutants.mutants_of(module_name) if m.operator == "wrong_wait_slot")
    text = ast.unparse(_mutants.mutated_tree(module_name, mutant))
    assert (
        "sems.at[(slot + 1) % (sems.shape[0] if hasattr(sems, 'shape') else len(sems))]).wait()"
        in text
    )


def test_the_modulo_goes_only_where_remote_traffic_is(module_name: str) -> None:
    mutant = next(m for m in _mutants.mutants_of(module_name) if m.operator == "no_modulo")
    text = ast.unparse(_mutants.mutated_tree(module_name, mutant))
    assert "right = me + 1\n" in text


def test_a_change_is_scored_on_every_line_of_its_statement(module_name: str) -> None:
    first = SOURCE.splitlines().index("    pltpu.make_async_copy(") + 1
    found = [m for m in _mutants.mutants_of(module_name, 99) if m.line in (first, first + 1)]
    assert {m.operator for m in found} >= {"drop_wait", "off_by_one_slot"}, found
    assert all(m.lines == (first, first + 2) for m in found), found


def test_a_guard_is_scored_on_its_own_line_not_the_function_it_guards(module_name: str) -> None:
    line = SOURCE.splitlines().index("    @pl.when(me == 0)") + 1
    mutant = next(m for m in _mutants.mutants_of(module_name) if m.operator == "unguarded_start")
    assert mutant.lines == (line, line)


def _shape(root: ast.AST) -> str:
    return ast.dump(root, include_attributes=False)


@pytest.mark.parametrize("operator", _mutants.OPERATORS)
def test_a_mutants_text_is_its_program_line_for_line(module_name: str, operator: str) -> None:
    # The checkers read a kernel's statements from its file: the text the lane shows
    # them must be the mutated program, with every other line where it was.
    original = SOURCE.splitlines()
    for mutant in (m for m in _mutants.mutants_of(module_name, 99) if m.operator == operator):
        text = _mutants.mutated_source(module_name, mutant)
        assert _shape(ast.parse(text)) == _shape(_mutants.mutated_tree(module_name, mutant))
        lines = text.splitlines()
        assert len(lines) == len(original)
        first, last = mutant.lines
        differ = {n + 1 for n, (a, b) in enumerate(zip(original, lines)) if a != b}
        assert differ and differ <= set(range(first, last + 1)) | {mutant.line}, (mutant, differ)


def test_a_mutants_text_is_shown_to_the_line_cache_only_inside(module_name: str) -> None:
    path = str(_mutants.source_path(module_name))
    mutant = next(m for m in _mutants.mutants_of(module_name) if m.operator == "drop_wait")
    with _mutants.source_shown(module_name, mutant):
        assert linecache.getline(path, mutant.line).strip() == "pass"
    assert linecache.getline(path, mutant.line) == SOURCE.splitlines(keepends=True)[mutant.line - 1]


def test_a_removed_statement_knows_the_line_it_followed(module_name: str) -> None:
    lines = SOURCE.splitlines()
    wait = lines.index("    copy.wait()") + 1
    mutant = next(
        m
        for m in _mutants.mutants_of(module_name, 99)
        if m.operator == "drop_wait" and m.line == wait
    )
    assert mutant.follows == wait - 1  # copy.start() on the line before


def test_a_message_names_a_removed_statement_by_the_line_it_belongs_after() -> None:
    def saying(message: str) -> _verdicts.Verdict:
        return _verdicts.Verdict("finding", "VerifiedRaceError", message, 0.0)

    path = "/pkg/kernel.py"
    assert saying("the wait belongs in f, after kernel.py:41").names_line(path, (42, 42), 41)
    assert saying("the wait belongs in f, after /pkg/kernel.py:41").names_line(path, (42, 42), 41)
    assert not saying("started at kernel.py:41").names_line(path, (42, 42), 41)
    assert not saying("belongs in f, after kernel.py:40").names_line(path, (42, 42), 41)
    assert not saying("belongs in f, after other.py:41").names_line(path, (42, 42), 41)
