"""Where a started or waited descriptor was made, read from source text alone."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from safedma.testing._descriptor_sites import made_at

SOURCE = textwrap.dedent(
    """\
    def kernel(a, b, sems, given):
        cp = make_async_copy(
            a, b, sems.at[0])
        cp.start()
        copies = []
        for k in range(2):
            one = make_async_copy(a.at[k], b.at[k], sems.at[k])
            copies.append(one)
        jax.tree.map(lambda c: c.start(), copies)
        for c in copies:
            c.wait()
        given.wait()
        make_async_copy(a, b, sems.at[1]).start()
        pair = [make_async_copy(a, b, sems.at[0]), make_async_copy(b, a, sems.at[1])]
        pair[1].wait()

        def inner():
            cp.wait()

        inner()
        _start_it(cp, True)
        _start_it(make_async_copy(a, b, sems.at[0]), True)


    def _start_it(desc, go):
        desc.start()
    """
)


@pytest.fixture
def source(tmp_path: Path) -> str:
    path = tmp_path / "kernel_source.py"
    path.write_text(SOURCE, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("line", "made"),
    [
        (4, (2,)),  # cp = make_async_copy(...) over two lines, then cp.start()
        (9, (7,)),  # a lambda mapped over a list filled by append
        (11, (7,)),  # a for loop over that list
        (12, ()),  # a parameter: made by the caller, whose line is named already
        (13, ()),  # built and started in one statement
        (15, (14,)),  # an element of a list literal
        (18, (2,)),  # a closure waiting the enclosing function's descriptor
    ],
)
def test_a_descriptor_is_followed_back_to_the_line_that_made_it(
    source: str, line: int, made: tuple[int, ...]
) -> None:
    assert made_at(source, line) == tuple((source, n) for n in made)


def test_a_descriptor_passed_to_a_helper_is_followed_to_the_caller_that_made_it(
    source: str,
) -> None:
    assert made_at(source, 26) == ()  # a parameter, and no caller given
    assert made_at(source, 26, ((source, 21),)) == ((source, 2),)  # the caller's cp
    # built in the call itself: the caller's own line, which messages name already
    assert made_at(source, 26, ((source, 22),)) == ()


def test_a_file_that_cannot_be_read_or_parsed_names_nothing(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def kernel(:\n    cp.start()\n", encoding="utf-8")
    assert made_at(str(broken), 2) == ()
    assert made_at(str(tmp_path / "missing.py"), 3) == ()
