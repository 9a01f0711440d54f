"""Legacy Estimator programs, written the way their authors wrote them.

Each module is one shape of public tf.estimator code (a tutorial, a TF1
port, a canned estimator, an unusual model_fn or input_fn signature).
None was changed for this package: no `params` where the original had
none, no `input_context` where the original had none. `corpus_test.py`
runs every one through `estimator_dist.train` and `estimator_dist.launch`.
"""
