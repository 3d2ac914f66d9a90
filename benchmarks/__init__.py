"""safedma's performance claims, each as a benchmark: ``./dev bench`` (``python -m benchmarks``).

1. identity   - run-time identity: Mosaic module and TPU code size, safedma vs pltpu twin
2. overhead   - trace and lowering time of DMA-heavy kernels, safedma vs pltpu
3. typecheck  - mypy and pyright time on a kernel file, safedma vs pltpu
4. tpu        - copy bandwidth, remote copies and collectives on a TPU, and on one chip
                safedma's kernels against raw pltpu, BlockSpec and XLA (compile-only without one)

On a TPU, ``python -m benchmarks.chip_mistakes`` runs the catalogue's mistakes on the chip.

See benchmarks/README.md for what each measures and the latest results.
"""
