"""Built-in engines: DeepSpeed (training, log-prob) and vLLM (sampling, log-prob)."""
