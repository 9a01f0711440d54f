"""The machine a task runs on: its cores, oneDNN, its CPU's flags, the precision it computes in."""
