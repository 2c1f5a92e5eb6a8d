"""Generative engines as backends: vLLM and Hugging Face transformers (optional extras).

What every engine reads and answers is declared once in `contract.py`; the frontends (OIP
generate, gRPC streams, the OpenAI API) and the bench rely on it and on nothing engine-specific.
"""
