"""Wire frontends: thin adapters from REST and gRPC to the DataPlane."""
