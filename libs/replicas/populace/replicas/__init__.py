"""Starting and installing LLM replicas, which register themselves for any gateway to find
(KV `replicas`): llama.cpp on SmolLM2 (launch, llamacpp: installed on first use), one `vllm
serve` per GPU or vLLM's CPU build (vllm_cpu, vllm_convert: prepared on first use), the
simulated vLLM replica (sim), and the guard that takes a server's whole process group with it
(guard). The gateway service only routes to replicas; it never starts one."""
