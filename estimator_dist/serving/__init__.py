"""Predictions from a job's exports, with the input_fn it trained with."""
