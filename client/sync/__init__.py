"""The sync driver: ``BertClient`` and ``ConcurrentBertClient``, waiting by polling ZeroMQ
sockets with a deadline (``transport``), one call at a time per client (``connection``)."""
