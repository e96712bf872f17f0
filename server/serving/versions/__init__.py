"""Model versions while serving, in the head's main process: the book of versions (:mod:`.book`),
the swap's plan (:mod:`.plan`) and the driver that swaps workers to a new version (:mod:`.swap`).
"""
