"""What the benchmark scripts share: servers, models, clients, statistics; scripts stay leaves.

servers.py starts and stops every server a script measures (dlscale as a user runs it, Triton,
MLServer, the in-process stacks) with one readiness poll; models.py builds the shared ONNX
models once; clients.py and grpc_clients.py are the closed-loop load generators; statistics.py
holds the rows, medians and the machine. A script imports `dlscale` and this package only.
"""
