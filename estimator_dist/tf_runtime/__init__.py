"""The one room where the package touches TensorFlow's internals (see docs/architecture.md).

`compat` (with `coordinator`) gives tensorflow-estimator 2.15.0 what TensorFlow
2.16+ removed; `patches` works around TensorFlow behaviours on every stack.
"""
