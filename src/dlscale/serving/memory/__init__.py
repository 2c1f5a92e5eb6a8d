"""Memory of loaded models: budgets, measurement at load, the eviction rule (docs/memory.md)."""
