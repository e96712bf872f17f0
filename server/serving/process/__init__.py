"""The supervising side of ``bertserve start``, in its main process: starting the sink, HTTP front
end and workers (:mod:`.supervisor`, :mod:`.children`), restarting them (:mod:`.restarts`),
checks before starting (:mod:`.preflight`), each model's workers (:mod:`.model_processes`) and
the staged shutdown (:mod:`.shutdown`). :mod:`.lifecycle`, :mod:`.children` and :mod:`.restarts`
are shared with the remote worker host.
"""
