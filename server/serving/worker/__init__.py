"""A worker process: runs the model over mini-jobs (:mod:`.worker`), fed by a prefetching feed
(:mod:`.feeds`). Started by the head's supervisor or by a remote worker host.
"""
