"""Building generated sources, and the on-disk cache the artifacts live in.

    cache_owner.py  who may own the cache directory (never a place another user could write)
    cache.py        the content-addressed cache: keys, entries, per-key OS locks, atomic publishing
    sim_build.py    compile flags, header digest and precompiled header of the SIMT simulator
    build.py        the host compiler and ninja: every missing kernel (C++, or GPU source for the
                    simulator) in one parallel ninja run, published through the cache
    gpu_build.py    builds by the vendors' own compilers (nvcc, hipcc) with their resource reports

Imports inside this room go one way: cache_owner <- cache <- sim_build <- build <- gpu_build.
Below it only the settings (knobs.py), the counters (stats.py) and the compiler (codegen/).
"""
