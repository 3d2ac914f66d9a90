"""Tests of the run-time library: brands, copies, devices, semaphores, kernel scope."""
