"""The CPU kernel families: one module per family, each holding its whole story (the algorithm name
and how it computes, its fit test and its rules over another family's choice, its tile choice, its
template per kernel op). The passes ask them; the emitter renders their templates.

Bottom to top (a module imports only from those above it in this list, and from codegen's floors):

- work.py      work items, reduction parts, register budget, shared geometry tests
- context.py   the context every CPU template is rendered with
- family.py    `Family`, what a family module exports as FAMILY
- families:    blocked, lanes_rows, lanes_operands, lanes (forward, data gradient; lanes over blocked), lanes_wgrad,
               direct, pointwise (forward, data gradient; the GEMM tile gemm shares), pointwise_wgrad,
               gemm, grouplanes, depthwise (planes forward and data gradient, depthwise weight
               gradient), planes (weight gradient over planes), amx, reduce (the bias gradient)
- families.py  the table the passes and the emitter look families up in
- generic.py   not a family of the table: the shape-generic kernels (every size at run time) that
               the runtime's tiers run for any problem until its own family's kernel is built

A new family is a module here exporting FAMILY, listed in families.py; where its `join` (fit test)
and `rule` (preference over the choice so far) come in passes/algorithm.py's JOINS and RULES is the
heuristic. The figures
behind the rules are in BENCHMARKS.md ("Figures behind codegen's CPU rules"). A new device's
families go in a package of their own beside this one (codegen/gpu/).
"""
