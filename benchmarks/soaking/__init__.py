"""The parts of ``soak.py``: the open-loop clients that check every reply (``clients``), and
what is made of their records, the targets and the markdown (``summary``)."""
