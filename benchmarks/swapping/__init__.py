"""What ``hot_swap.py`` and ``swap_neighbour.py`` share: a model version written as a
deployment writes it (``versions``), and clients that check every reply against the version
it names (``load``)."""
