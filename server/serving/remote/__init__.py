"""Remote workers: ``bertserve worker``, a process on another machine whose workers join a head
over tcp (:mod:`.host`), its configuration (:mod:`.config`) and its container probes
(:mod:`.probes`). The head's side of the link is :mod:`bertserve.server.serving.head.link`.
"""
