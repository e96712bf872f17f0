"""The sink process: reassembles each request from its parts (:mod:`.sink`, :mod:`.pending`) and
sends it to its client (:mod:`.replies`, holding it until the client connects: :mod:`.held`),
with the errors owed for replies it had to drop (:mod:`.owed`).
"""
