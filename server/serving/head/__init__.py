"""The head's loop, in the main process of ``bertserve start``: the ventilator (:mod:`.ventilator`)
and what it owns: clients and admission (:mod:`.clients`, :mod:`.admitted`), control commands,
dispatch to workers, deadlines (:mod:`.expiry`), the served models, the worker registry, the
line to the sink, the remote workers' link (:mod:`.link`) and the gauges of ``/metrics``.
"""
