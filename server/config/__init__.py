"""Options, one object per concern: a model's (:mod:`.model`), the server's (:mod:`.server`),
built from it the scheduler's batching (:mod:`.batching`), the head's bounds (:mod:`.limits`)
and the HTTP edge's rules (:mod:`.http`); the syntax of ``--model`` specs (:mod:`.specs`) and
the models one server serves (:mod:`.served`). Plain values, no sockets and no TensorFlow:
every process may import them.
"""
