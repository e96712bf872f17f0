"""Options, one object per concern, each built and checked once: the server's
(:mod:`.server`) made of its parts, where it listens (:mod:`.ports`), its workers
(:mod:`.workers`), the scheduler's batching (:mod:`.batching`), the head's bounds
(:mod:`.limits`), the HTTP front end (:mod:`.http`), security and bert-as-service's clients
(:mod:`.security`), and the models served (:mod:`.served`), each a model's options
(:mod:`.model`); the syntax of ``--model`` specs (:mod:`.specs`). Plain values, no sockets, no
TensorFlow and no downloads: every process may import them.
"""
