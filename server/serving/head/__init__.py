"""The head's loop, in the main process of ``bertserve start``: the ventilator (:mod:`.ventilator`)
and what it owns: clients and admission (:mod:`.clients`), the one owner of each request's
lifecycle (:mod:`.requests`, over the book :mod:`.admitted`), control commands, dispatch to
workers, deadlines (:mod:`.expiry`), the served models, the worker registry, the line to the
sink, the remote workers' link (:mod:`.link`, :mod:`.handshake`) and the gauges of ``/metrics``.
"""
