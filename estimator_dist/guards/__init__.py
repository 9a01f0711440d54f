"""What keeps a task from hanging or losing work: the rendezvous before TensorFlow
starts, the watchdogs on steps and evaluations, the preemption stop, the start-up
timings.
"""
