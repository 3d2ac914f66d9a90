"""Tests of safedma.testing: simulate, Mosaic identity, compile-only builds."""
