"""Flags to configuration: the frozen `JobConfig` and the flags that make it.

Every training setting is defined here once; entry points parse flags into a
`JobConfig`, and library code receives that object instead of reading FLAGS.
"""
