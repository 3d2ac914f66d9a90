"""Kernels, pallas_call set-ups and hand-written pltpu twins shared by the tests and the benchmarks."""
