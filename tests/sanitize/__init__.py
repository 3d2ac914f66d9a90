"""Tests of the DMA sanitizer (``sanitize=True``): what it catches, that correct kernels
pass it, that off it costs nothing, and (marked ``tpu``) that it works on a chip."""
