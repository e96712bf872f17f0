"""The asyncio driver: ``AsyncBertClient``, waiting on the event loop through pyzmq's asyncio
sockets (``transport``), its sends taking their turn for a place in the window (``places``)."""
