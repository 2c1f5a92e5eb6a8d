"""The OpenAI-compatible API (`/v1/models`, `/v1/completions`, `/v1/chat/completions`,
`/v1/embeddings`, and vLLM's `/health`, `/version`, `/tokenize`, `/detokenize`) on the REST
port, over the same Plane, queue, priorities and deadlines as the Open Inference Protocol.

docs/openai.md says what it serves and how; `routes.py` is the entry, `decode.py` reads the
requests, `tools.py` their tools and response formats, `encode.py` writes the answers,
`embeddings.py` serves encoders and `errors.py` OpenAI's error shape.
"""
