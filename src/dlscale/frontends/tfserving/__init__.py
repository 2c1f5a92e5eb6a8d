"""TensorFlow Serving's API over any model: what its requests and answers mean for a model that
is not TensorFlow's (signatures, statuses, classify and regress), shared by REST and gRPC.

docs/tfserving.md says what maps to what; frontends/rest/tfserving.py and
frontends/grpc/tfserving.py carry it on the wire.
"""
