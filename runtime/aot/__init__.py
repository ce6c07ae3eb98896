"""Ahead of time: a model's problems -> readable sources and a manifest -> one importable bundle.

    aot.py   generate (sources, bundle module, manifest) and build (one ninja run) a bundle

The bundle format and the loading of bundles at run time are dispatch's (dispatch/bundle.py),
since dispatch serves their kernels; the `convgen aot` command is cli/aot.py's. This room uses
dispatch (to plan each kernel as the JIT would) and building; nothing below it imports it.
"""
