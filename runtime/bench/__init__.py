"""convgen measured against torch: speed (`convgen bench`) and correctness (`convgen check`).

    suites.py  the curated problem sets, each case with what it targets
    peak.py    the machine's f32 FMA peak, measured by a generated probe
    bench.py   the benchmark method (on the CPU, or on a CUDA device) and its report
    call.py    the cost of one call, on the CPU
    table.py   the printed table
    check.py   one problem's kernels, every pass, against ATen in float64

These call the public functions (api/) and prepare kernels through dispatch/; the command line
(cli/) is above them.
"""
