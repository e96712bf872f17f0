"""The model core: reading model directories, tokenization, the optimized graph, the Encoder.

Nothing here knows about sockets; the serving roles use a model only through ``interface``.
"""
