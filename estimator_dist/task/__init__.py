"""One task's run of a training job: the pre-flight, the driver around
`tf.estimator.train_and_evaluate`, users' functions called as Estimator calls them,
exports, records, and what a failure means.
"""
