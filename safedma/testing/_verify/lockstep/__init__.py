"""verify's lockstep path: one walk of an SPMD device program for every device at once.

``model`` (every device's protocol state as numpy arrays), ``records`` (the packed
table of which device and epoch settled each access), ``clocks`` (what each device
has learned of the others, circulant on rings), ``values`` (scalars as arrays over the
devices), ``walker`` (the walk itself: kernels, jaxprs, refs, device ids),
``pipeline`` (a grid's block copies around each step), ``scoped`` (``run_scoped``
regions), ``rules`` (each primitive's rule), ``prove`` (the entry point: proved, or
why it gave up).
"""
