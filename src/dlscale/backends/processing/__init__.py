"""Built-in processing steps (docs/processing.md): image decoding, tokenization and top-k labels,
each a backend that batches like a model, for pipelines around a model."""
