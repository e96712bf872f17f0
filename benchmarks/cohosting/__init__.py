"""The parts of ``models.py``, several models behind one head: the load it sends and the check
of every reply (``load``), and the targets and the markdown (``summary``)."""
