"""bertserve: sentence embeddings from a BERT model behind a ZeroMQ server.

``bertserve.client`` talks to a server and installs without TensorFlow (``pip install .``);
``bertserve.server`` is the server (``pip install '.[server]'``). setup.py installs this file
as ``bertserve/__init__.py``, so that ``bertserve`` is a regular package and not a namespace
package: Python takes a regular package from any entry of ``sys.path`` over namespace portions
found before it, so a folder named ``bertserve`` in the current directory (a clone of this
repository, say) cannot put its ``client`` and ``server`` in place of the installed ones.
It imports nothing: importing the client never loads the server.
"""
