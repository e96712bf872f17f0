"""What tests and benchmarks of bertserve, or of a program that uses it, start servers with:

- :mod:`.launcher`: a real server (``bertserve start``) or worker host (``bertserve worker``)
  in a child process, started through the command line, waited for until ready and stopped;
- :mod:`.config`: a server's config built in the test itself, named by the options it cares
  about (:func:`.config.server_config`);
- :mod:`.tiny_bert`: tiny BERT models written to a folder in each layout bertserve reads,
  with a NumPy forward pass to check the server's vectors against.
"""
