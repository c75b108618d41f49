"""Populace's benchmarks: `dummy` (the paper's dummy benchmark through every service),
`gateway` (the inference gateway's overhead and routing) and `vllm` (routing and prompts on real
vLLM). `populace bench …` parses flags and calls them; results are written under bench/results/."""
