"""Where the missing wait of a started copy belongs, read from the kernel's source: the
other branch of a start-or-wait helper's flag, the function a descriptor never
leaves, or the waiting counterpart of the method that starts it; nothing when the
source does not tell."""

from __future__ import annotations

import linecache
import textwrap
from pathlib import Path

import pytest

from safedma.testing._missing_waits import where_the_wait_belongs

SOURCE = textwrap.dedent(
    """\
    def start_or_wait(src, dst, sem, wait):
        cp = make_async_copy(src, dst, sem)
        if wait:
            pass
        else:
            cp.start()


    def start_only_when_not_waiting(src, dst, sem, wait):
        cp = make_async_copy(src, dst, sem)
        if not wait:
            cp.start()


    def start_or_wait_done_right(src, dst, sem, wait):
        cp = make_async_copy(src, dst, sem)
        if wait:
            cp.wait()
        else:
            cp.start()


    def copy_table(src, dst, sem):
        table_copy = make_async_copy(src, dst, sem)
        table_copy.start()


    def copies_in_a_list(src, dst, sem, copies):
        one = make_async_copy(src, dst, sem)
        one.start()
        copies.append(one)


    def returned(src, dst, sem):
        one = make_async_copy(src, dst, sem)
        one.start()
        return one


    def waited_on_another_path(src, dst, sem, early):
        one = make_async_copy(src, dst, sem)
        one.start()
        if early:
            one.wait()


    def captured(src, dst, sem):
        one = make_async_copy(src, dst, sem)
        one.start()
        return lambda: one.wait()


    def on_a_flag_that_is_not_a_parameter(src, dst, sem):
        cp = make_async_copy(src, dst, sem)
        if GLOBAL:
            pass
        else:
            cp.start()


    class WindowRef:
        def copy_in(self, src, slot):
            @loop(0, 4)
            def _(i):
                make_async_copy(src.at[i], self.window.at[slot, i], self.sems.at[slot]).start()

        def wait_in(self, src, slot):
            del src
            window = self.window.at[slot]

        def copy_out(self, dst, slot):
            make_async_copy(self.window.at[slot], dst, self.sems.at[slot]).start()

        def wait_out(self, dst, slot):
            ...


    class PagesDescriptor:
        def start(self):
            for cp in self.copies:
                cp.start()

        def wait(self):
            for cp in self.copies:
                self.count += 1
            return self.buffer


    class WaitedByAHelper:
        def start(self):
            self.cp.start()

        def wait(self):
            self._drain()


    class TwoCounterparts:
        def copy_in_start(self):
            self.cp.start()

        def wait_in_start(self):
            pass

        def copy_in_wait(self):
            pass
    """
)


@pytest.fixture
def source(tmp_path: Path) -> str:
    path = tmp_path / "kernel_source.py"
    path.write_text(SOURCE, encoding="utf-8")
    return str(path)


def _line(text: str, after: int = 0) -> int:
    lines = SOURCE.splitlines()
    return next(n + 1 for n in range(after, len(lines)) if lines[n].strip() == text)


def _function(name: str) -> int:
    return next(
        n + 1 for n, line in enumerate(SOURCE.splitlines()) if line.startswith(f"def {name}(")
    )


def _note(source: str, function: str, start: str) -> str:
    line = _line(start, _function(function))
    return where_the_wait_belongs(f"{source}:{line} ({function})")


def test_a_start_or_wait_helper_whose_wait_branch_waits_nothing_names_that_branch(
    source: str,
) -> None:
    note = _note(source, "start_or_wait", "cp.start()")
    branch = _line("pass", _function("start_or_wait"))
    condition = branch - 1
    assert f"under `if wait:` at kernel_source.py:{condition}" in note
    assert f"the branch at kernel_source.py:{branch} (when `wait` is true)" in note
    assert "the wait belongs there" in note


def test_a_helper_that_starts_only_when_not_waiting_asks_for_an_else_branch(
    source: str,
) -> None:
    note = _note(source, "start_only_when_not_waiting", "cp.start()")
    assert "under `if not wait:`" in note
    assert "nothing waits for it when `wait` is true" in note


def test_a_descriptor_that_never_leaves_its_function_is_waited_there(source: str) -> None:
    start = _line("table_copy.start()", _function("copy_table"))
    note = _note(source, "copy_table", "table_copy.start()")
    assert "`table_copy` never leaves copy_table" in note
    assert f"after kernel_source.py:{start}" in note


@pytest.mark.parametrize(
    ("function", "start"),
    [
        ("start_or_wait_done_right", "cp.start()"),  # its wait is there: nothing is missing
        ("copies_in_a_list", "one.start()"),  # kept in a list: waited wherever that goes
        ("returned", "one.start()"),
        ("waited_on_another_path", "one.start()"),  # a wait is there, on some path
        ("captured", "one.start()"),  # a lambda may wait it
    ],
)
def test_the_source_says_nothing_where_it_does_not_tell(
    source: str, function: str, start: str
) -> None:
    assert _note(source, function, start) == ""


def test_a_branch_on_anything_but_a_flag_parameter_is_no_start_or_wait_helper(
    source: str,
) -> None:
    note = _note(source, "on_a_flag_that_is_not_a_parameter", "cp.start()")
    assert "the branch at" not in note
    assert "`cp` never leaves on_a_flag_that_is_not_a_parameter" in note


def _in_class(name: str, text: str) -> int:
    return _line(text, _function_in_class(name))


def _function_in_class(name: str) -> int:
    return next(
        n + 1
        for n, line in enumerate(SOURCE.splitlines())
        if line.strip().startswith(f"def {name}(")
    )


def test_a_copy_in_whose_wait_in_waits_nothing_names_the_end_of_wait_in(source: str) -> None:
    start = _line("make_async_copy(src.at[i], self.window.at[slot, i], self.sems.at[slot]).start()")
    note = where_the_wait_belongs(f"{source}:{start} (_)")
    wait_in = _function_in_class("wait_in")
    assert "started in `WindowRef.copy_in`" in note
    assert f"`WindowRef.wait_in` at kernel_source.py:{wait_in} waits for nothing" in note
    last = _line("window = self.window.at[slot]", wait_in)
    assert f"the wait belongs in `wait_in`, at its end, after kernel_source.py:{last}" in note


def test_a_counterpart_with_an_empty_body_names_its_body(source: str) -> None:
    start = _line("make_async_copy(self.window.at[slot], dst, self.sems.at[slot]).start()")
    note = where_the_wait_belongs(f"{source}:{start} (copy_out)")
    body = _function_in_class("wait_out") + 1
    assert f"the wait belongs in `wait_out`, in its body at kernel_source.py:{body}" in note


def test_a_start_whose_wait_returns_a_buffer_names_the_line_before_the_return(
    source: str,
) -> None:
    start = _line("cp.start()", _function_in_class("start"))
    note = where_the_wait_belongs(f"{source}:{start} (start)")
    wait = _function_in_class("wait")
    loop_end = _line("self.count += 1", wait)
    ret = _line("return self.buffer", wait)
    assert f"`PagesDescriptor.wait` at kernel_source.py:{wait} waits for nothing" in note
    assert f"after kernel_source.py:{loop_end}, before its return at kernel_source.py:{ret}" in (
        note
    )


@pytest.mark.parametrize(
    ("start", "method"),
    [
        ("self.cp.start()", "start"),  # its wait calls an inherited method that may wait
        ("self.cp.start()", "copy_in_start"),  # two methods could be its counterpart
    ],
)
def test_a_counterpart_that_may_wait_or_is_not_one_says_nothing(
    source: str, start: str, method: str
) -> None:
    line = _line(start, _function_in_class(method))
    assert where_the_wait_belongs(f"{source}:{line} ({method})") == ""


def test_an_edited_file_is_read_again(source: str) -> None:
    line = _line("pass", _function("start_or_wait"))
    assert _note(source, "start_or_wait", "cp.start()")
    edited = SOURCE.splitlines(keepends=True)
    edited[line - 1] = edited[line - 1].replace("pass", "cp.wait()")
    saved = linecache.cache.get(source)
    linecache.cache[source] = (len("".join(edited)), None, edited, source)
    try:
        assert _note(source, "start_or_wait", "cp.start()") == ""
    finally:
        linecache.cache.pop(source, None)
        if saved is not None:
            linecache.cache[source] = saved


def test_a_location_that_is_not_a_file_says_nothing() -> None:
    assert where_the_wait_belongs("a run_scoped buffer") == ""
    assert where_the_wait_belongs("/no/such/file.py:3 (kernel)") == ""
