"""Training without a shared file system: model_dir on object storage or on each task's disk.

`location` decides where a task works and where the job's results live;
`remote` reaches the storage through fsspec; `sync` moves checkpoints and
results between a task's local directory and the storage; `task` is the one
call a task's run makes (`task_storage`), and `job` is what the launcher
reads of a job whose results live at a URL.
"""
