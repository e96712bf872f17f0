"""The client core, sans-IO: what ``BertClient`` and ``AsyncBertClient`` share, written once.

No module here opens a socket or waits. ``options`` checks what a client is given;
``handshake`` says what a connecting client asks, when it asks again and what the answer
means; ``requests`` frames and checks what a request carries; ``replies`` matches each reply
to its request; ``window`` counts the requests the server may still answer; ``results`` turns
replies into vectors or errors; ``chunking`` cuts a big input into requests and joins their
answers; ``base`` holds one client's share of all this and plans each call of the client API
once, as the ``steps`` a driver does; ``api`` takes both clients' options. The drivers,
``sync`` and ``aio``, own the sockets and the waiting (the HTTP front end's gateway is one more
user of the ``aio`` transport).
"""
