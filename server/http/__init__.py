"""The HTTP front end: OpenAI-, TEI- and bert-as-service-compatible endpoints, health,
readiness and metrics, in a process of its own that reaches the ventilator over ZeroMQ.

Nothing here imports TensorFlow.
"""
