"""verify reads the program: jaxprs compiled into closures that each participant runs.

``context`` (what a participant's program sees: refs, the run it is part of),
``compiler`` (jaxprs compiled once into closures, run as generators), ``scalars``
(exact scalar primitives), ``outer`` (known values of a ``shard_map``'s operands),
``output_reads`` (which parts of the kernels' outputs the program around them reads),
``patchy`` (garbage in arrays of the program around the kernels).
"""
