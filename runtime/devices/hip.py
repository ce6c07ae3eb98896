"""A ROCm build of torch: what differs from devices/cuda.py, which serves both.

On ROCm, torch's device is still 'cuda' and `torch.version.hip` is set; a device's arch is its
`gcnArchName` with the target features after the colon ('gfx90a:sramecc+:xnack-' is gfx90a).
Loading and launching are cuda.py's `GpuKernel` (the HIP plan entry takes the same pointers,
batch size and stream; hipcc builds it, building/gpu_library.py).
"""

from __future__ import annotations


def arch_name(gcn_arch_name: str) -> str:
    """The arch of a gcnArchName: 'gfx90a:sramecc+:xnack-' -> 'gfx90a'."""
    return str(gcn_arch_name).split(":", 1)[0].strip().lower()
