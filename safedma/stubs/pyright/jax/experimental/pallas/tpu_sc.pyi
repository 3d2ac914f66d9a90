# pyright: basic
"""Pass-through stub for ``jax.experimental.pallas.tpu_sc`` (SparseCore), jax 0.10.2 to 0.12.x.

safedma types nothing here. The stub exists because pyright and basedpyright,
given a ``jax/experimental/pallas`` tree on ``stubPath``, look for
``from jax.experimental.pallas import tpu_sc`` only in that tree: without this file
that import is "unknown import symbol" and every ``plsc.`` name ``Unknown`` (as
in 10 production kernel files of vLLM tpu-inference and tokamax). Each name is
re-exported from the jax module that defines it, so it keeps jax's own type.
"""

from jax._src.pallas.mosaic.sc_core import Indices as Indices
from jax._src.pallas.mosaic.sc_core import ScalarSubcoreMesh as ScalarSubcoreMesh
from jax._src.pallas.mosaic.sc_core import VectorSubcoreMesh as VectorSubcoreMesh
from jax._src.pallas.mosaic.sc_core import get_sparse_core_info as get_sparse_core_info
from jax._src.pallas.mosaic.sc_primitives import PackFormat as PackFormat
from jax._src.pallas.mosaic.sc_primitives import addupdate as addupdate
from jax._src.pallas.mosaic.sc_primitives import addupdate_compressed as addupdate_compressed
from jax._src.pallas.mosaic.sc_primitives import addupdate_scatter as addupdate_scatter
from jax._src.pallas.mosaic.sc_primitives import all_reduce_ffs as all_reduce_ffs
from jax._src.pallas.mosaic.sc_primitives import (
    all_reduce_population_count as all_reduce_population_count,
)
from jax._src.pallas.mosaic.sc_primitives import bitcast as bitcast
from jax._src.pallas.mosaic.sc_primitives import cummax as cummax
from jax._src.pallas.mosaic.sc_primitives import cumsum as cumsum
from jax._src.pallas.mosaic.sc_primitives import fetch_and_add as fetch_and_add
from jax._src.pallas.mosaic.sc_primitives import load_expanded as load_expanded
from jax._src.pallas.mosaic.sc_primitives import load_gather as load_gather
from jax._src.pallas.mosaic.sc_primitives import pack as pack
from jax._src.pallas.mosaic.sc_primitives import parallel_loop as parallel_loop
from jax._src.pallas.mosaic.sc_primitives import scan_count as scan_count
from jax._src.pallas.mosaic.sc_primitives import sort_key_val as sort_key_val
from jax._src.pallas.mosaic.sc_primitives import store_compressed as store_compressed
from jax._src.pallas.mosaic.sc_primitives import store_scatter as store_scatter
from jax._src.pallas.mosaic.sc_primitives import subcore_barrier as subcore_barrier
from jax._src.pallas.mosaic.sc_primitives import unpack as unpack

# 0.12-only (Any on 0.10.2, where using them fails at run time with AttributeError).
# The ignores are for 0.10.2; unused-ignore keeps them quiet on 0.12.
from jax._src.pallas.mosaic.sc_core import (  # type: ignore[attr-defined, unused-ignore]
    SparseCorePushStreamWarning as SparseCorePushStreamWarning,
)
from jax._src.pallas.mosaic.sc_primitives import (  # type: ignore[attr-defined, unused-ignore]
    slice_subcore_vmem_from_shared as slice_subcore_vmem_from_shared,
)
