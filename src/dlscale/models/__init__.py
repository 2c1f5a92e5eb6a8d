"""Models: configuration, the on-disk repository, the built-in zoo, FLOP and byte counting."""
