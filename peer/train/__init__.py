"""Training: trainer, tasks, partition, checkpoints. No ZeroMQ and no runtime: the simulator imports it."""
