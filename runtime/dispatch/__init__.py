"""Dispatch: from a convolution call to the loaded kernel that computes it.

    problem.py   torch tensors and ATen-style arguments -> ConvProblem, with the tensor-level checks
    tuning.py    the tuning database (per machine) and the tuning mode's timing of candidates
    bundle.py    ahead-of-time bundles at run time: their format (manifest, build record) and
                 loading; the kernels they serve with zero compiles
    dispatch.py  the table: problem key -> plan and loaded kernel (a bundle's, else planned, built
                 through building/ and loaded on its device through devices/)

Imports inside this room go one way: problem <- tuning, bundle <- dispatch. Below it: devices,
building, knobs and stats (see runtime/README.md).
"""
