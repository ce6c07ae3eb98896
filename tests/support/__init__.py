"""What the tests share, in one place (importable as `support`: pyproject.toml puts tests/ on sys.path).

- reference.py: what results are compared against (ATen in float64, the tolerances per dtype),
  random operands, memory formats, and checks of one loaded kernel against ATen;
- problems.py: ConvProblems for the tests that plan or run one kernel directly;
- cases.py: the correctness cases of CASES.md (items 1-22), their operands and their check;
- calls.py: the property tests' random convolution calls (hypothesis) and their check;
- builds.py: building a module's kernels up front, in one ninja run;
- code_shapes.py: x86 code shapes as test targets, compiled for this host where it lacks their ISA;
- gpu_plans.py: what the GPU plans of a call launch (to count simulated launches);
- toolchain.py: vendor tools found on PATH or in pip packages, and a script run under ASan/UBSan;
- commands.py: `convgen` commands run in this process;
- aot_models.py: small models for the ahead-of-time tests (also imported by their subprocesses);
- paths.py: where the repository's parts are.

The tests themselves live in one room per concern (api/, cpu/, gpu/, sim/, building/, codegen/,
aot/, cli/; the repository as a whole at the top). pytest imports each test file by its base
name, so base names are unique across the rooms.
"""
