"""The launcher: starts a job's tasks on an engine, supervises them, decides what a
failure means and restarts the job when a restart can help.
"""
