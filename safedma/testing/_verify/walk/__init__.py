"""verify's per-device walk: every participant's program run through the protocol model.

``engine`` (participants, buffers, scheduler), ``ops`` (memory and semaphore
primitives), ``kernel_desc`` (what every participant needs to know of one
``pallas_call``), ``kernels`` (one ``pallas_call`` on one participant), ``blocks``
(the block each BlockSpec operand's index map names at a grid point),
``block_garbage`` (garbage in the blocks Pallas copies), ``megacore`` (which chips
split which grid dimensions, and how), ``cores`` (``pl.kernel`` over TensorCore and
SparseCore meshes), ``run_state`` (refs made from arrays around kernels). Importing
``ops``, ``kernels``, ``cores`` and ``run_state`` adds their rules to the compiler.
"""
