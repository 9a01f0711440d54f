"""The cluster a task belongs to: TF_CONFIG, and what platforms and pods say instead."""
