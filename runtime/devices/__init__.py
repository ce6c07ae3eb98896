"""Per-device loading and launching: from a built artifact to a kernel called on a device's memory.

    cpu.py   C functions in shared libraries (JIT-built, or inside an ahead-of-time bundle),
             loaded with ctypes and called on the data pointers of CPU tensors
    sim.py   the SIMT simulator as a device: GPU kernels built for the CPU (building/sim_build.py)
             run on CPU tensors' memory, with their launches counted and failures raised

Room for the GPUs (not written yet):

    cuda.py  kernels built by nvcc for the arch of a torch CUDA device (building/gpu_build.py),
             loaded through their extern "C" launch entry (pointers by role, batch size, stream)
             and launched on torch's current stream without synchronising
    hip.py   the same for a ROCm build of torch (torch.version.hip set; the device is still
             'cuda'), with the kernels hipcc builds for the device's gcnArchName

Each device module owns how its artifacts load and how a call passes its tensors; dispatch
(dispatch/dispatch.py) picks the module by the plan's target. Devices sit below dispatch and
above building/ (a corrupt artifact is rebuilt by dispatch, not here).
"""
