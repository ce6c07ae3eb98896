"""What the compiler knows of the machines it generates for, as data: CPU ISA levels (cpu.py) and GPU
architectures (gpu.py). Nothing here reads the machine or imports the rest of the compiler."""
