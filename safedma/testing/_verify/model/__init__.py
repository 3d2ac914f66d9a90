"""verify's protocol model: the TPU's DMA and semaphore rules, with no jaxpr in them.

``regions`` (buffers, and the box of a buffer a ref view covers), ``clocks`` (vector
clocks for happens-before), ``waits`` (what a wait guarantees, made
schedule-independent by replaying with hints), ``semantics`` (semaphores, copies in
flight, accesses: the rules of docs/verify-model.md), ``leftovers`` (what a count left in a
semaphore is made of), ``termination`` (loops that cannot end, the time budget).
"""
