"""The foundation every package of estimator-dist may import.

Errors and their exit codes, the name registry, settings that carry their
flags, params parsing, the files a job keeps in model_dir. Nothing here imports
any other room of `estimator_dist` (`tf_runtime` aside), nor `input_fns`,
`model_fns` or `run_config`.
"""
