"""Whole programs run unchanged: a user's `--script` or `--module`, its strategy
chosen for it, its train()/evaluate() loops and its last step on a cluster.
"""
