"""Tests of the Pallas GPU protocol checker (safedma.testing.verify_gpu); they need no GPU."""
