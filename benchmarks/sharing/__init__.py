"""The scenarios of ``shared.py``: one server shared by many clients, at its edges and under faults.

One module per scenario (``memory`` holds the two of resident memory, ``unread`` and
``bigframe``), each a function from a :class:`sharing.bench.Bench` to its JSON result;
``report`` turns the results into the markdown table.
"""
