"""What a GPU trace says beyond compute and communication: where the device's idle time goes,
the step in the former TensorBoard plugin's categories, and the kernels that ran."""
