"""The one room where the package touches TensorFlow's internals (see docs/architecture.md)."""
