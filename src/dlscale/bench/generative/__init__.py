"""Token-level benchmarks of generative endpoints (OpenAI and OIP generate); docs/bench.md."""
