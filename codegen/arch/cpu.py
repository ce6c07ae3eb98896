"""The CPU ISA levels convgen generates code for, and their vector widths in bytes."""

ISA_WIDTHS = {"avx512": 64, "avx2": 32, "generic": 16}
