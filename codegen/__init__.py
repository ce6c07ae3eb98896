"""convgen's compiler: the problem IR, the pass pipeline and the emitter. Never imports torch."""
