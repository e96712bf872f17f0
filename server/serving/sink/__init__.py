"""The sink process: reassembles each request from its parts (:mod:`.sink`) and sends it to its
client (:mod:`.replies`), with the errors owed for replies it had to drop (:mod:`.owed`).
"""
