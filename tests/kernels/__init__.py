"""Tests of safedma.kernels against their twins."""
