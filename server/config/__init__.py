"""Options, one object per concern: a model's (:mod:`.model`), the server's (:mod:`.server`), the
syntax of ``--model`` specs (:mod:`.specs`) and the models one server serves (:mod:`.served`).
Plain values, no sockets and no TensorFlow: every process may import them.
"""
