"""The parts of ``lengths.py``: the contenders' names, what is measured and the targets
(``plan``), the inputs of an exact length (``inputs``), the in-process contenders, each in a
process of its own (``children``), the contenders in turns at each length (``sweep``), and the
markdown and plot (``report``)."""
