"""Tests of safedma.testing.verify: protocol verdicts, agreement with simulate, jax's kernels."""
