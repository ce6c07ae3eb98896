"""The GPU kernel families and what they share, for CUDA and HIP targets from one template set.

One module per family, each with its fit test (`refusal`), tile choice, template context and
template name, gathered in a `Family` record: direct.py (the reference kernel: one thread per
result), igemm.py (the implicit GEMM on matrix instructions; its tiles in igemm_tiles.py, the
layout pass's staging decision in staging.py, the forward's zero-padded channels in padding.py, which
operands copy by iterator in iterators.py), depthwise.py and stem.py (shared-memory windows,
their common pieces in windows.py). families.py lists them in order of preference; the algorithm
and tiling passes iterate over that list, and entry.py emits a plan's file from it. resources.py
is `convgen explain`'s occupancy and roofline. generic.py is the GPU's shape-generic tier: the direct
kernels with every size at run time (runtime/dispatch/tiers.py serves it). Arch facts and tile configurations are data in
codegen/arch/gpu.py.

Imports flow one way, bottom to top: wrappers, normal, context, family -> windows, igemm_tiles
-> padding, iterators -> staging -> direct, depthwise, stem, igemm -> generic, families, resources -> entry. A new family is a
module beside the others and an entry in families.py.
"""
