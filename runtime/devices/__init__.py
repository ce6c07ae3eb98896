"""Per-device loading and launching: from a built artifact to a kernel called on a device's memory.

    cpu.py   C functions in shared libraries (JIT-built, or inside an ahead-of-time bundle),
             loaded with ctypes and called on the data pointers of CPU tensors
    sim.py   the SIMT simulator as a device: GPU kernels built for the CPU (building/sim_build.py)
             run on CPU tensors' memory, with their launches counted and failures raised
    hip.py   what a ROCm build of torch differs in (torch.version.hip set; the device is still
             'cuda'): the device's arch from its gcnArchName
    cuda.py  a torch 'cuda' device's target (its compute capability, or hip.py's arch), and
             GpuKernel: kernels nvcc/hipcc built for that arch (building/gpu_library.py) or an
             ahead-of-time bundle's fat library, loaded through their extern "C" plan entry
             (pointers by role, batch size, stream) and launched on torch's current stream
             without synchronising

Each device module owns how its artifacts load and how a call passes its tensors; dispatch
(dispatch/dispatch.py) picks the module by the plan's target. Devices sit below dispatch and
above building/ (a corrupt artifact is rebuilt by dispatch, not here).
"""
