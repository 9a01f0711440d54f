"""Flags to configuration: the frozen `JobConfig` and the flags generated from it.

Every training setting is written once, as a field of `JobConfig` (or of the
`run_config.options` classes it nests) that carries its flag; entry points
parse flags into a `JobConfig`, and library code receives that object instead
of reading FLAGS.
"""
