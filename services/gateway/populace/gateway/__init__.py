"""inference-gateway: answers batched `llm.infer` requests through a model backend."""
