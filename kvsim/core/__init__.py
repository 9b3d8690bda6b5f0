"""Core values and errors: the one-line input error, whole-or-nothing files, chunk
keys, request context, byte units, counting trees. Everything else imports these."""
