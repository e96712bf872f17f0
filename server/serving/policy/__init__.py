"""The head's policy, as plain objects: what runs next and for whom (:mod:`.scheduler`, :mod:`.lanes`,
:mod:`.jobs`), what the workers get through (:mod:`.throughput`) and what is admitted
(:mod:`.admission`). No sockets, no ZeroMQ and no TensorFlow: tested on its own.
"""
