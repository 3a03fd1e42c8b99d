"""L1, the model: router, FFNs, expert dispatch, decoder, router losses, LM loss, decoding matmuls."""
