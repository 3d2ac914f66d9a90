"""Hand-written pltpu twins of the kernels in safedma.kernels (same Mosaic module)."""
