"""A trainer package in the shape of Google Cloud AI Platform's: `python -m trainer.task`."""
