"""REST worker processes: the pool, each worker, typed messages, and the owner's side."""
