"""Jinja templates, shipped as package data (cpu/: C++/OpenMP; gpu/: CUDA and HIP)."""
