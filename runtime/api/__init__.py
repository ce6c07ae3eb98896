"""The torch-facing API: what users call, and what torch calls on convgen's behalf.

    functional.py   conv1d/2d/3d, conv_transpose*, convolution, convolution_backward: the eager
                    path (autograd Functions, the launcher) or, when traced, the registered ops
    library.py      torch.ops.convgen.convolution / convolution_backward: schemas, CPU and fake
                    kernels, their autograd, and the gradient formulas both paths share
    ops.py          ATen-style calls on generated kernels: tensors -> problems -> dispatch -> run
    eager.py        the compiled launcher that runs eager forward calls and records their nodes
    serve_aten.py   enabled() / enable() / disable(): convgen serving aten's own convolutions
    shapes.py       collect(): the problems one training step of a model dispatches

The modules (convgen.nn) live at the top of the package: their classes are pickled by that name.
Imports inside this room go one way: eager <- ops <- library <- functional, ops <- serve_aten <-
shapes. Below it: dispatch, devices, building, knobs and stats (see runtime/README.md).
"""
