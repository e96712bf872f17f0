"""The ``bertserve`` command line of the server side: its parser and flags (:mod:`.flags`), how ``--help``
shows them (:mod:`.flag_help`), and the commands (:mod:`.main`). Runs in the process the user starts.
"""
