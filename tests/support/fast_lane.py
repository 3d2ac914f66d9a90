"""The lanes of the suite, and which worker runs what (a pytest plugin; tests/conftest.py
loads it).

Three lanes, by marker:

* ``heavy``: the heaviest matrices (every mesh size and dtype of the collectives on 8
  and 2x4 devices, hypothesis properties, the wheel built and installed in a fresh venv,
  the type checkers over jax's own kernels). ``./dev test`` leaves them out; ``./dev
  test --slow`` runs only them; CI runs them in one environment per run, alternating
  (.ci/run). Marked here by node id (``HEAVY_NODE_IDS``) and in modules.
* ``slow``: not in the fast lane (``./dev test --fast`` is ``-m "not slow"`` on py312).
  Every heavy test is slow too. Marked by node id (``SLOW_NODE_IDS``), in modules, and by
  the rule below.
* everything else runs in every lane.

What stays fast: every test function once. A parametrised test keeps its first
parametrisation that no pattern below names (the rest are ``slow``), unless it is in
``EVERY_PARAMETRISATION`` (tests whose parameters are different products, such as each
library kernel against its twin); a corpus driver (tests/tools/) keeps its first case of
each DMA pattern family (the sanitizer's, its first case).

Workers (pytest-xdist, ``--dist loadgroup``): tests that share a module- or session-wide
set-up run on one worker, so it is made once: each type checker's run over a corpus (one
group per module and checker), the wheel built and installed, the wheel resolved for
other platforms. A pattern is a node id in which ``*`` matches anything (brackets are
literal).
"""

from __future__ import annotations

import re

import pytest

HEAVY_NODE_IDS = (
    # 1024-device rings proved in lockstep: all_gather stays in ./dev test, the two
    # collectives with more events per step (same mechanism) run in the slow lane.
    "tests/testing/verify/test_lockstep.py::test_a_1024_device_ring_*[reduce_scatter]",
    "tests/testing/verify/test_lockstep.py::test_a_1024_device_ring_*[all_reduce]",
    # Properties (hypothesis) and whole-matrix agreement of the collectives.
    "tests/kernels/test_*.py::test_any_mesh_dtype_shape_and_*",
    "tests/kernels/test_pipeline.py::test_any_shape_chunking_and_dtype",
    "tests/kernels/test_all_reduce.py::test_fused_and_composed_agree_bit_for_bit",
    "tests/kernels/test_identity.py::test_overhead_benchmark_pairs_lower_alike",
    # Each collective against jax's own on 8 devices and on the 2x4 mesh (2 and 4
    # devices stay in ./dev test), and verify against simulate on the same meshes.
    "tests/kernels/test_all_reduce.py::test_matches_psum[8-*",
    "tests/kernels/test_all_reduce.py::test_matches_psum[2x4-*",
    "tests/kernels/test_reduce_scatter.py::test_matches_psum_scatter[8-*",
    "tests/kernels/test_reduce_scatter.py::test_matches_psum_scatter[2x4-*",
    "tests/kernels/test_ppermute.py::test_matches_lax_ppermute[8-*",
    "tests/kernels/test_ppermute.py::test_matches_lax_ppermute[2x4-*",
    "tests/kernels/test_all_gather.py::test_matches_lax_all_gather[*-8-*",
    "tests/kernels/test_all_gather.py::test_matches_lax_all_gather[*-2x4-*",
    "tests/kernels/test_all_gather.py::test_any_concat_and_split_axis*",
    "tests/kernels/test_all_gather.py::test_float32_16x256_on_8_devices*",
    "tests/kernels/test_pipeline.py::test_each_device_pipelines_its_shard[8-*",
    "tests/kernels/test_pipeline.py::test_each_device_pipelines_its_shard[2x4*",
    "tests/kernels/test_gather.py::test_each_device_gathers_from_its_shard[8-*",
    "tests/kernels/test_gather.py::test_each_device_gathers_from_its_shard[2x4*",
    "tests/testing/verify/test_agreement.py::test_verify_and_simulate_agree[*-8]",
    "tests/testing/verify/test_agreement.py::test_verify_and_simulate_agree[*-2x4]",
    # The wheel built, installed in a fresh venv with the checkers, and resolved for
    # other platforms (minutes, and the same wheel in either environment).
    "tests/packaging/test_wheel_install.py::*",
    "tests/packaging/test_dry_run.py::*",
    # mypy and pyright over every kernel jax ships (about 3 minutes).
    "tests/typing/test_patterns_raw_kernels.py::*",
)

SLOW_NODE_IDS = (
    # Type checkers that take seconds to tens of seconds per session (cold caches):
    # the corpora run under pyrefly and ty in the fast lane.
    "tests/typing/test_corpus.py::*[mypy*",
    "tests/typing/test_corpus.py::*[pyright*",
    "tests/typing/test_corpus.py::*[basedpyright*",
    "tests/typing/test_stubs.py::*[mypy*",
    "tests/typing/test_stubs.py::*[pyright*",
    "tests/typing/test_stubs.py::*[basedpyright*",
    "tests/typing/test_stubs.py::test_stubtest_against_installed_jax",
    "tests/typing/test_mypy_plugin.py::test_run_is_understood",
    "tests/typing/test_mypy_plugin.py::test_plugin_messages*",
    "tests/typing/test_mypy_plugin.py::test_corpus_and_library_unchanged_under_the_plugin",
    # mypy and pyright over the typed GPU example and its mistakes (a minute, cold cache).
    "tests/gpu/test_typed_gpu_typing.py::*",
    # Property tests (hypothesis) and whole-matrix agreement: 10-30 s each.
    "tests/kernels/test_*.py::test_any_mesh_dtype_shape_and_*",
    "tests/kernels/test_pipeline.py::test_any_shape_chunking_and_dtype",
    "tests/kernels/test_all_reduce.py::test_fused_and_composed_agree_bit_for_bit",
    "tests/kernels/test_identity.py::test_overhead_benchmark_pairs_lower_alike",
    # Each collective against jax's own on the 4-, 8- and 2x4-device meshes; the
    # 2-device cases stay in the fast lane.
    "tests/kernels/test_all_reduce.py::test_matches_psum[4-*",
    "tests/kernels/test_all_reduce.py::test_matches_psum[8-*",
    "tests/kernels/test_all_reduce.py::test_matches_psum[2x4-*",
    "tests/kernels/test_reduce_scatter.py::test_matches_psum_scatter[4-*",
    "tests/kernels/test_reduce_scatter.py::test_matches_psum_scatter[8-*",
    "tests/kernels/test_reduce_scatter.py::test_matches_psum_scatter[2x4-*",
    "tests/kernels/test_ppermute.py::test_matches_lax_ppermute[4-*",
    "tests/kernels/test_ppermute.py::test_matches_lax_ppermute[8-*",
    "tests/kernels/test_ppermute.py::test_matches_lax_ppermute[2x4-*",
    "tests/kernels/test_all_gather.py::test_matches_lax_all_gather[*-4-*",
    "tests/kernels/test_all_gather.py::test_matches_lax_all_gather[*-8-*",
    "tests/kernels/test_all_gather.py::test_matches_lax_all_gather[*-2x4-*",
    # Larger-mesh and compile-only variants whose smaller siblings stay fast (5-12 s each
    # on the loaded machine): every axis pair of the all-gather, 8-device 16x256 blocks,
    # the v6e compile of each kernel (test_identity compiles them for v6e too).
    "tests/kernels/test_all_gather.py::test_any_concat_and_split_axis*",
    "tests/kernels/test_all_gather.py::test_float32_16x256_on_8_devices*",
    "tests/kernels/test_all_gather.py::test_both_kernels_back_to_back_share_a_collective_id",
    "tests/kernels/test_*.py::test_compiles_for_v6e*",
    # Tests that start a type checker or a pytest/python subprocess (seconds to minutes
    # each, cold): the cheapest test of each module stays in the fast lane (the README's
    # install section, the import hygiene of `safedma` itself, the plugin's usage error,
    # libtpu's error class, the corpora and the library under pyrefly).
    "tests/packaging/test_readme.py::test_first_kernel_is_clean_under_mypy_strict",
    "tests/packaging/test_import_hygiene.py::test_import_changes_no_environment_variable_and_no_jax_config[safedma.*",
    "tests/packaging/test_import_hygiene.py::test_snapshot_sees_a_change",
    "tests/packaging/test_pytest_plugin.py::test_ini_option_sets_the_device_count*",
    "tests/packaging/test_pytest_plugin.py::test_a_mesh_too_large_names_the_option",
    "tests/packaging/test_pytest_plugin.py::test_a_conftest_that_imports_jax_first_still_gets_the_devices",
    "tests/packaging/test_pytest_plugin.py::test_command_line_overrides_the_ini",
    "tests/packaging/test_pytest_plugin.py::test_without_the_option_nothing_changes",
    "tests/packaging/test_libtpu_missing.py::test_compile_for_tpu_without_libtpu_names_the_extra",
    "tests/typing/test_corpus.py::test_library_is_clean[ty]",
    # Simulations whose smaller or simpler siblings stay in the fast lane: each kernel
    # keeps its 2-device runs in one dtype per form, its twin identity on one mesh and
    # its v6e identity (test_identity); verify keeps its device-free proofs on rings of
    # 2 and 4 and one simulate agreement per local kernel; the runner keeps its
    # single-thread checks.
    "tests/kernels/test_all_reduce.py::test_matches_psum[2-bfloat16-fused]",
    "tests/kernels/test_all_reduce.py::test_matches_psum[2-float32-composed]",
    "tests/kernels/test_all_reduce.py::test_same_mosaic_as_the_pltpu_twin[2x4-*",
    "tests/kernels/test_reduce_scatter.py::test_matches_psum_scatter[2-tall-float32]",
    "tests/kernels/test_reduce_scatter.py::test_matches_psum_scatter[2-wide-bfloat16]",
    "tests/kernels/test_reduce_scatter.py::test_same_mosaic_as_the_pltpu_twin[2x4-*",
    "tests/kernels/test_pipeline.py::test_each_device_pipelines_its_shard[4-*",
    "tests/kernels/test_pipeline.py::test_each_device_pipelines_its_shard[8-*",
    "tests/kernels/test_pipeline.py::test_each_device_pipelines_its_shard[2x4-y-*",
    "tests/kernels/test_pipeline.py::test_each_device_pipelines_its_shard[2x4-x-*",
    "tests/kernels/test_pipeline.py::test_each_device_pipelines_its_shard[2-bfloat16]",
    "tests/kernels/test_pipeline.py::test_each_device_pipelines_its_shard[2x4-yx-float32]",
    "tests/kernels/test_pipeline.py::test_matches_reference_on_one_device[24x256-*",
    "tests/kernels/test_pipeline.py::test_matches_reference_on_one_device[64x*",
    "tests/kernels/test_pipeline.py::test_matches_reference_on_one_device[80x256-*",
    "tests/kernels/test_gather.py::test_each_device_gathers_from_its_shard[4-*",
    "tests/kernels/test_gather.py::test_each_device_gathers_from_its_shard[8-*",
    "tests/kernels/test_gather.py::test_each_device_gathers_from_its_shard[2x4-y-*",
    "tests/kernels/test_gather.py::test_each_device_gathers_from_its_shard[2x4-x-*",
    "tests/kernels/test_gather.py::test_each_device_gathers_from_its_shard[2-bfloat16]",
    "tests/kernels/test_gather.py::test_each_device_gathers_from_its_shard[2x4-yx-float32]",
    "tests/kernels/test_identity.py::test_identical_to_its_twin_on_v6e[bench.*",
    # The collectives' v6e identity: each kernel's test_same_mosaic_as_the_pltpu_twin
    # stays fast, on its smallest mesh.
    "tests/kernels/test_identity.py::test_identical_to_its_twin_on_v6e[kernels.all_*",
    "tests/kernels/test_identity.py::test_identical_to_its_twin_on_v6e[kernels.reduce_scatter]",
    "tests/kernels/test_reduce_scatter.py::test_matches_psum_scatter[2-tall-bfloat16]",
    "tests/kernels/test_pipeline.py::test_each_device_pipelines_its_shard[2x4-yx-bfloat16]",
    "tests/kernels/test_gather.py::test_each_device_gathers_from_its_shard[2x4-yx-bfloat16]",
    "tests/testing/test_simulate.py::test_hard_upper_bound_when_the_watchdog_cannot_stop_the_run",
    "tests/testing/test_simulate.py::test_slow_kernel_without_a_waiter_is_stopped_too",
    "tests/testing/verify/test_agreement.py::test_verify_and_simulate_agree[kernels.*",
    "tests/testing/verify/test_agreement.py::test_verify_and_simulate_agree[*-safedma-*",
    "tests/testing/verify/test_agreement.py::test_verify_proves_the_kernel_clean_on_a_device_free_mesh[*-8]",
    "tests/testing/verify/test_agreement.py::test_verify_proves_the_kernel_clean_on_a_device_free_mesh[*-2x4]",
    "tests/testing/verify/test_agreement.py::test_one_collective_id_twice_in_a_row_is_safe[2x4-*",
    "tests/testing/verify/test_properties.py::test_safedma_collectives_are_clean_for_every_ring",
    "tests/testing/test_runner.py::test_interrupted_process_exits_normally",
    "tests/testing/test_runner.py::test_plain_interpret_kernel_in_another_thread_is_refused_and_the_simulation_unharmed",
    "tests/testing/test_runner.py::test_slow_sender_within_timeout_passes",
    "tests/testing/test_runner.py::test_simulate_refuses_to_start_while_another_thread_runs_an_interpret_kernel",
    "tests/testing/test_runner.py::test_slow_sender_outliving_timeout_is_a_timeout_saying_it_was_still_running",
    "tests/testing/test_runner.py::test_interrupt_during_4_device_simulate_leaves_the_process_usable*",
    # Single tests of several seconds each whose subject the fast lane meets elsewhere:
    # a user's jit around a kernel, verify's memory bounds and its two wait paths, a
    # first interpret-mode compile with compute, the import of the whole package in a
    # fresh interpreter, pyrefly's runs (ty checks the corpora in the fast lane), a
    # pytester run of the plugin, the MoE transport on a 2x4 mesh.
    "tests/testing/test_simulate_user_jit.py::test_a_users_jit_around_a_kernel_runs_and_its_broken_twin_is_caught",
    "tests/testing/verify/test_memory_bounds.py::test_pruned_random_runs_find_the_same_early_contributions_or_fall_back",
    "tests/testing/verify/test_memory_bounds.py::test_tight_bounds_say_what_no_bounds_say_of_every_protocol_case",
    "tests/testing/verify/test_speed.py::test_the_one_contribution_wait_path_computes_what_the_general_path_does",
    "tests/core/test_interpret.py::test_local_copy_with_compute",
    "tests/packaging/test_import_hygiene.py::test_import_changes_no_environment_variable_and_no_jax_config[safedma]",
    "tests/typing/test_corpus.py::*[pyrefly*",
    "tests/typing/test_stubs.py::*[pyrefly*",
    "tests/packaging/test_pytest_plugin.py::test_a_bad_value_is_a_usage_error",
    "tests/testing/verify/test_moe_transport.py::test_the_moe_transport_is_clean_on_a_2x4_mesh",
    "tests/typing/test_corpus.py::*[ty*",
    "tests/core/test_interpret.py::test_sliced_copies_with_semaphore_array",
    "tests/core/test_interpret.py::test_remote_ring_permute_four_devices*",
    "tests/testing/test_simulate_clock_entries.py::test_a_long_loop_of_waited_copies_reuses_entries_and_runs_once",
    "tests/testing/test_simulate_clock_entries.py::test_a_read_of_an_unwaited_copy_among_many_in_flight_is_a_race*",
    "tests/testing/test_simulate_clock_entries.py::test_many_in_flight_runs_again_with_an_entry_for_each",
    "tests/kernels/test_*.py::test_compiles_for_16_chips*",
    "tests/kernels/test_*.py::test_compiles_for_large_v6e_meshes*",
    # The 1024-device ring (17 s; ./dev test keeps it): the fast lane proves rings of 2
    # to 8 devices in lockstep.
    "tests/testing/verify/test_lockstep.py::test_a_1024_device_ring_*",
    # The verify plugin's runs of a whole pytest of their own (10-15 s each): with and
    # without the option, through the ini key and the environment variable, and a
    # sanitized project. The fast lane keeps the plugin's in-process tests (its hooks in
    # jax, the sanitized kernels' verdicts, the usage errors). And the check that xdist
    # keeps these groups (a pytest of its own).
    "tests/pytest_verify/test_verify_every_kernel.py::*",
    "tests/pytest_verify/test_options.py::test_the_environment_variable_*",
    "tests/pytest_verify/test_options.py::test_the_ini_key_*",
    "tests/pytest_verify/test_sanitized_kernels.py::test_through_pytest_*",
    "tests/tooling/test_worker_groups.py::*",
    # Watchdog tests that wait out a timeout on purpose (about 5 s each).
    "tests/testing/test_simulate.py::test_r4_copy_left_in_flight_by_the_last_loop_iteration",
    "tests/testing/test_simulate.py::test_r3_receiver_waits_for_a_send_that_never_comes",
)


# Parametrised tests whose every parametrisation stays in the fast lane.
EVERY_PARAMETRISATION = (
    "tests/kernels/test_identity.py::test_identical_to_its_twin_on_v6e",
    "tests/docs/test_links.py::test_relative_link_resolves_inside_the_repository",
)


# Corpus drivers: their cases are parameters; the fast lane keeps one per pattern family.
CORPUS_DRIVERS = "tests/tools/test_"
# Drivers whose cases take seconds each (a kernel run in interpret mode under the
# sanitizer, 5-20 s): the fast lane keeps their first case only, and meets the rest of
# what they check in their own tests (tests/sanitize).
ONE_CASE_DRIVERS = ("tests/tools/test_sanitize_corpus.py::test_sanitize",)

# Tests sharing a set-up that is made once per worker: (node id pattern, xdist group).
# A type checker's run is per module (its own corpus copy and cache) and per checker.
_CHECKERS = ("mypy", "pyright", "basedpyright", "pyrefly", "ty")
GROUPS = (
    *(
        (f"tests/typing/{module}.py::*[{checker}]*", f"{module}-{checker}")
        for module in ("test_corpus", "test_stubs")
        for checker in _CHECKERS
    ),
    *(
        (f"tests/typing/{module}.py::*[{checker}-*", f"{module}-{checker}")
        for module in ("test_corpus", "test_stubs")
        for checker in _CHECKERS
    ),
    ("tests/typing/test_mypy_plugin.py::*", "test_mypy_plugin"),
    ("tests/gpu/test_typed_gpu_typing.py::*", "test_typed_gpu_typing"),
    ("tests/typing/test_patterns_raw_kernels.py::*", "test_patterns_raw_kernels"),
    ("tests/packaging/test_wheel_install.py::*", "test_wheel_install"),
    ("tests/packaging/test_dry_run.py::*", "test_dry_run"),
    # A pytest run with and without --safedma-verify (about 14 s each), and the manual's
    # strict build (about 7 s).
    ("tests/pytest_verify/test_verify_every_kernel.py::*", "test_verify_every_kernel"),
    ("tests/docs/test_manual.py::*", "test_manual"),
)


def _function_id(item: pytest.Item) -> str:
    return item.nodeid.split("[", 1)[0]


def _fast_key(item: pytest.Item) -> str:
    """What the fast lane keeps one of: a test function, or a driver's pattern family."""
    function = _function_id(item)
    if function.startswith(CORPUS_DRIVERS) and function not in ONE_CASE_DRIVERS:
        case = getattr(item, "callspec").params.get("case")
        if case is not None:
            return f"{function}[{case.pattern}]"
    return function


def _keep_one_parametrisation(items: list[pytest.Item]) -> None:
    """Mark ``slow`` every parametrisation after the first fast one of each test function
    (of each pattern family, for a corpus driver)."""
    seen: set[str] = set()
    for item in items:
        if getattr(item, "callspec", None) is None or item.get_closest_marker("slow"):
            continue
        if _function_id(item) in EVERY_PARAMETRISATION:
            continue
        key = _fast_key(item)
        if key in seen:
            item.add_marker(pytest.mark.slow)
        seen.add(key)


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


_HEAVY = [(pattern, _compile(pattern)) for pattern in HEAVY_NODE_IDS]
_SLOW = [(pattern, _compile(pattern)) for pattern in SLOW_NODE_IDS]
_GROUPS = [(_compile(pattern), group) for pattern, group in GROUPS]


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker, before xdist reads groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    used: set[str] = set()
    for item in items:
        for pattern, regex in _HEAVY:
            if regex.fullmatch(item.nodeid):
                item.add_marker(pytest.mark.heavy)
                used.add(pattern)
        if item.get_closest_marker("heavy"):
            item.add_marker(pytest.mark.slow)
        for pattern, regex in _SLOW:
            if regex.fullmatch(item.nodeid):
                item.add_marker(pytest.mark.slow)
                used.add(pattern)
        group = next((g for regex, g in _GROUPS if regex.fullmatch(item.nodeid)), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    _keep_one_parametrisation(items)
    # A whole-suite collection that misses a pattern means a test was renamed or moved:
    # the lanes would silently change, so the run stops.
    if config.args_source is pytest.Config.ArgsSource.TESTPATHS:
        stale = [p for p, _ in (*_HEAVY, *_SLOW) if p not in used]
        if stale:
            raise pytest.UsageError(
                f"tests/support/fast_lane.py: patterns that match no test: {stale}"
            )
