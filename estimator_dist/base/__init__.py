"""The foundation every package of estimator-dist may import.

Errors and their exit codes, the name registry, params parsing, TF_CONFIG
and the catalogue of multi-worker pitfalls. Nothing here imports
`input_fns`, `model_fns`, `run_config` or the rest of `estimator_dist`.
"""
