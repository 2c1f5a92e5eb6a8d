"""The one tensor wire codec: Open Inference Protocol tensors over REST and gRPC, both ways.

`tensors` holds the rules every encoding shares (raw bytes, BYTES elements, JSON data, typed
values); `rest` the REST body layout (JSON header and binary tensors); `grpc` the ModelInfer
messages; `proto` the gRPC schema and its generated stubs. The server's frontends and the
bench's clients use the same functions, in opposite directions.
"""
