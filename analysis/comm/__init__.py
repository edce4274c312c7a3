"""Communication: the collective-instance table, bandwidth as nccl-tests defines it, baselines."""
