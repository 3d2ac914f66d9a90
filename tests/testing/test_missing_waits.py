"""Where the missing wait of a started copy belongs, read from the kernel's source: the
other branch of a start-or-wait helper's flag, the function a descriptor never
leaves, or the waiting counterpart of the method that starts it; nothing when the
source does not tell."""

from __future__ import annotations

import linecache
import textwrap
from pathlib import Path

import pytest

from safedma.testing._missing_waits import waitless_wait_note, where_the_wait_belongs

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


FUNCTIONS = textwrap.dedent(
    """\
    def zero_out_start(out, sem):
        for i in range(4):
            make_async_copy(ZEROS, out.at[i], sem).start()


    def zero_out_end(out, sem):
        \"\"\"Drain the copies zero_out_start started.\"\"\"
        whole = out.at[pl.ds(0, 4)]


    def _start_copy_kernel(src, dst, sem):
        @loop(0, 4)
        def start_copy(i):
            make_async_copy(src.at[i], dst.at[i], sem).start()


    def _wait_copy_kernel(src, dst, sem):
        @loop(0, 4)
        def wait_copy(i):
            size = SIZES[i]


    def scores_kernel(src, dst, sems):
        def _async_copy(src, dst, sem, wait):
            cp = make_async_copy(src, dst, sem)
            if wait:
                cp.wait()
            else:
                cp.start()

        def wait_send(slot):
            old = SIZES[slot]

        def start_send(slot):
            _async_copy(src.at[slot], dst.at[slot], sems.at[slot], wait=False)

        start_send(0)


    def fetch_pages(src, dst, sem):
        make_async_copy(src, dst, sem).start()


    def wait_pages(src, dst, sem):
        drain_pages(dst, sem)


    def drain_pages(dst, sem):
        make_async_copy(dst, dst, sem).wait()


    def fetch_kernel(src, dst, sem, fast):
        fetch_fn = FAST if fast else SLOW

        def start_fetch_kv(i):
            make_async_copy(src.at[i], dst.at[i], sem).start()

        def wait_fetch_kv(i):
            return fetch_fn(i)

        def start_fetch_q(i):
            make_async_copy(src.at[i], dst.at[i], sem).start()

        def wait_fetch_q(i):
            return helpers.fetch(i, wait=True)


    class PagesCopy:
        def start(self):
            for i in range(4):
                make_async_copy(self.pages.at[i], self._buffer.at[i], self._sem).start()
                make_async_copy(self.scales.at[i], self._scales.at[i], self._sem).start()

        def wait_and_get(self):
            \"\"\"Waits for the pages and reads them.\"\"\"
            make_async_copy(self._scales, self._scales, self._sem).wait()
            return self._buffer[...]


    def state_kernel(state_hbm, bufs, sems, is_new):
        def _prefetch():
            make_async_copy(state_hbm, bufs.at[1], sems.at[1]).start()

        @when(is_new)
        def _wait_state():
            pass

        h = bufs[0]
        return h


    def outer_kernel(state_hbm, bufs, sems):
        def process():
            def _wait_for_buffer():
                count = COUNTS[0]

                def _do_wait():
                    pass

            total = 0
            return store(bufs)

        def store(bufs):
            bufs[0] = 1
            return bufs


    def late_kernel(state_hbm, bufs, sems, is_new):
        h = bufs[0]

        @when(is_new)
        def _wait_state():
            pass

        return h


    def waited_kernel(state_hbm, bufs, sems, is_new):
        @when(is_new)
        def _wait_state():
            make_async_copy(bufs.at[0], bufs.at[0], sems.at[0]).wait()

        h = bufs[0]
        return h


    def copies_looped_over(src, dst, sem):
        copies = [make_async_copy(src.at[i], dst.at[i], sem) for i in range(4)]
        for cp in copies:
            cp.start()
        total = 0
        for cp in copies:
            total += 1
        for cp in copies:
            cp.wait()


    def copies_appended(src, dst, sem):
        copies = []
        for i in range(4):
            one = make_async_copy(src.at[i], dst.at[i], sem)
            one.start()
            copies.append(one)
        return dst


    def copies_waited_in_order(src, dst, sem):
        copies = []
        for i in range(4):
            one = make_async_copy(src.at[i], dst.at[i], sem)
            one.start()
            copies.append(one)
        for one in copies:
            one.wait()


    def copies_handed_on(src, dst, sem):
        copies = [make_async_copy(src.at[i], dst.at[i], sem) for i in range(4)]
        for cp in copies:
            cp.start()
        return copies


    def one_or_several(src, dst, sem, several):
        if several is None:
            page_copy = make_async_copy(src, dst, sem)
            page_copy.start()
        else:
            copies = [make_async_copy(s, d, sem) for s, d in several]
            for page_copy in copies:
                page_copy.start()
            for page_copy in copies:
                page_copy.wait()
    """
)


@pytest.fixture
def functions(tmp_path: Path) -> str:
    path = tmp_path / "kernel_functions.py"
    path.write_text(FUNCTIONS, encoding="utf-8")
    return str(path)


def _at(text: str, after: str = "", *, nth: int = 0) -> int:
    lines = FUNCTIONS.splitlines()
    first = next(n for n, line in enumerate(lines) if after in line) if after else 0
    found = [n + 1 for n in range(first, len(lines)) if lines[n].strip() == text]
    return found[nth]


def test_a_function_whose_end_counterpart_waits_nothing_names_its_end(functions: str) -> None:
    start = _at("make_async_copy(ZEROS, out.at[i], sem).start()")
    note = where_the_wait_belongs(f"{functions}:{start} (zero_out_start)")
    end = _at("whole = out.at[pl.ds(0, 4)]")
    assert f"its counterpart `zero_out_end` at kernel_functions.py:{end - 2}" in note
    assert f"the wait belongs in `zero_out_end`, at its end, after kernel_functions.py:{end}" in (
        note
    )


def test_a_nested_start_names_the_nested_counterpart_in_the_waiting_kernel(
    functions: str,
) -> None:
    start = _at("make_async_copy(src.at[i], dst.at[i], sem).start()", "def start_copy")
    note = where_the_wait_belongs(f"{functions}:{start} (_start_copy_kernel.<locals>.start_copy)")
    size = _at("size = SIZES[i]")
    assert "started in `_start_copy_kernel`" in note
    assert f"the wait belongs in `wait_copy`, at its end, after kernel_functions.py:{size}" in note


def test_a_start_through_a_helper_names_the_counterpart_of_its_caller(functions: str) -> None:
    start = _at("cp.start()", "def _async_copy")
    caller = _at("_async_copy(src.at[slot], dst.at[slot], sems.at[slot], wait=False)")
    where = (
        f"{functions}:{start} (scores_kernel.<locals>._async_copy, called at "
        f"kernel_functions.py:{caller} in scores_kernel.<locals>.start_send, "
        f"kernel_functions.py:{caller + 2} in scores_kernel)"
    )
    note = where_the_wait_belongs(where)
    old = _at("old = SIZES[slot]")
    assert "started in `start_send`, and its counterpart `wait_send`" in note
    assert f"at its end, after kernel_functions.py:{old}" in note
    # without the caller, the helper alone has no counterpart
    assert where_the_wait_belongs(f"{functions}:{start} (_async_copy)") == ""


def test_a_counterpart_that_waits_only_other_buffers_names_its_start(functions: str) -> None:
    start = _at("make_async_copy(self.pages.at[i], self._buffer.at[i], self._sem).start()")
    note = where_the_wait_belongs(f"{functions}:{start} (PagesCopy.start)")
    docstring = _at('"""Waits for the pages and reads them."""')
    assert "counterpart `PagesCopy.wait_and_get`" in note
    assert "waits only for copies into `self._scales`, none into `self._buffer`" in note
    assert (
        f"the wait belongs in `wait_and_get`, at its start, after kernel_functions.py:{docstring}"
        in (note)
    )
    # the copy it does wait for gets no note
    waited = _at("make_async_copy(self.scales.at[i], self._scales.at[i], self._sem).start()")
    assert where_the_wait_belongs(f"{functions}:{waited} (PagesCopy.start)") == ""


@pytest.mark.parametrize(
    ("starting", "start"),
    [
        # its counterpart calls a function that waits
        ("def fetch_pages", "make_async_copy(src, dst, sem).start()"),
        # its counterpart calls a function held in a variable
        ("def start_fetch_kv", "make_async_copy(src.at[i], dst.at[i], sem).start()"),
        # its counterpart asks a helper to wait (``wait=True``)
        ("def start_fetch_q", "make_async_copy(src.at[i], dst.at[i], sem).start()"),
    ],
)
def test_a_counterpart_that_may_wait_through_a_call_says_nothing(
    functions: str, starting: str, start: str
) -> None:
    line = _at(start, starting)
    assert where_the_wait_belongs(f"{functions}:{line} (f)") == ""


def test_the_first_loop_over_a_list_that_does_not_wait_its_copies_is_named(
    functions: str,
) -> None:
    start = _at("cp.start()", "def copies_looped_over")
    note = where_the_wait_belongs(f"{functions}:{start} (copies_looped_over)")
    body = _at("total += 1")
    assert f"the loop over `copies` at kernel_functions.py:{body - 1} does not wait" in note
    assert f"the wait belongs in its body at kernel_functions.py:{body}" in note


def test_copies_appended_to_a_list_nothing_loops_over_are_waited_after_the_loop(
    functions: str,
) -> None:
    start = _at("one.start()", "def copies_appended")
    note = where_the_wait_belongs(f"{functions}:{start} (copies_appended)")
    loop_end = _at("copies.append(one)", "def copies_appended")
    assert "it is kept in `copies`, which never leaves copies_appended" in note
    assert f"after kernel_functions.py:{loop_end}, before their buffers are used" in note


@pytest.mark.parametrize(
    ("after", "start"),
    [
        ("def copies_waited_in_order", "one.start()"),  # the next loop over the list waits
        ("def copies_handed_on", "cp.start()"),  # the list is returned: waited elsewhere
        ("def one_or_several", "page_copy.start()"),  # the else branch's own list is waited
    ],
)
def test_a_list_that_is_waited_or_leaves_says_nothing(
    functions: str, after: str, start: str
) -> None:
    line = _at(start, after, nth=1 if after == "def one_or_several" else 0)
    assert where_the_wait_belongs(f"{functions}:{line} (f)") == ""


def test_a_wait_in_the_other_branch_on_a_name_bound_there_does_not_wait_this_copy(
    functions: str,
) -> None:
    start = _at("page_copy.start()", "def one_or_several")
    note = where_the_wait_belongs(f"{functions}:{start} (one_or_several)")
    assert f"the wait belongs in one_or_several, after kernel_functions.py:{start}" in note


def test_a_function_named_for_waiting_that_waits_nothing_is_named_for_the_access(
    functions: str,
) -> None:
    read = _at("h = bufs[0]")
    note = waitless_wait_note(f"{functions}:{read} (state_kernel)")
    body = _at("pass", "def _wait_state")
    assert f"`_wait_state` at kernel_functions.py:{body - 1}, named for waiting" in note
    assert f"the wait belongs there, in its body at kernel_functions.py:{body}" in note


def test_the_innermost_waitless_function_on_the_callers_chain_is_named(functions: str) -> None:
    write = _at("bufs[0] = 1")
    call = _at("return store(bufs)")
    note = waitless_wait_note(
        f"{functions}:{write} (outer_kernel.<locals>.store, called at "
        f"kernel_functions.py:{call} in outer_kernel.<locals>.process)"
    )
    body = _at("pass", "def _do_wait")
    assert f"`_do_wait` at kernel_functions.py:{body - 1}" in note, note


def test_a_waitless_function_defined_after_the_access_is_not_named(functions: str) -> None:
    read = _at("h = bufs[0]", "def late_kernel")
    assert waitless_wait_note(f"{functions}:{read} (late_kernel)") == ""


def test_a_function_named_for_waiting_that_waits_is_not_named(functions: str) -> None:
    read = _at("h = bufs[0]", "def waited_kernel")
    assert waitless_wait_note(f"{functions}:{read} (waited_kernel)") == ""
