"""Benchmarks, run by hand; not part of the test suite."""

#: Steps between checkpoints and between summaries of every Estimator contender: more than
#: any run trains, so none is written while timed. The same for all: Estimator's
#: CheckpointSaverHook assumes 1,000,000 steps per session call and, whenever the interval
#: is at most that, reads the global step again in a session call of its own after every
#: step, which a contender with a longer interval would be spared.
NEVER_STEPS = 10**9
