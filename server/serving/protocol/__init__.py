"""What the server's processes say to each other, parsed at the edge: internal frames
(:mod:`.wire`), the worker link's messages (:mod:`.link`, :mod:`.link_bodies`), the messages to
the sink (:mod:`.sink`), reply formats (:mod:`.formats`), bert-as-service's wire format
(:mod:`.legacy`), and what every loop does alike with its sockets (:mod:`.sockets`). Imported by
every process; imports none of them.
"""
