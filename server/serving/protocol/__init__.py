"""What the server's processes say to each other and to clients, parsed at the edge: internal frames
(:mod:`.wire`), the messages the sink reads (:mod:`.sink`), the worker link's messages (:mod:`.link`,
:mod:`.link_bodies`), an ENCODE request's
options (:mod:`.request_options`), reply formats (:mod:`.formats`) and bert-as-service's wire
format (:mod:`.legacy`). Imported by every process; imports none of them.
"""
