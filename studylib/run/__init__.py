"""L2, one model x one seed: run directories, checkpoints, data, distributed set-up, optimizer,
trainer and decoding."""
