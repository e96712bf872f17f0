"""The serving side, one package per process or part:

- :mod:`.process`: ``bertserve start``'s supervisor (main process), which runs the head;
- :mod:`.head`: the head's loop (ventilator) and the state it owns, in the main process;
- :mod:`.policy`: the head's scheduling and admission policy, pure (no sockets, no TensorFlow);
- :mod:`.versions`: model versions and the swap driver, in the main process;
- :mod:`.sink`: the sink process;
- :mod:`.worker`: a worker process;
- :mod:`.remote`: ``bertserve worker``, the host of remote workers on another machine;
- :mod:`.protocol`: the frames and messages between them, parsed at the edge.
"""
