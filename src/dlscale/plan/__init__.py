"""Planning: all-reduce cost model, training time, batching-server queueing, serving capacity."""
