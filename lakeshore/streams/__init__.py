"""Streams on the store: journal segments (``journal``), following one invocation's
journal across attempts (``stream``), and topics not tied to an invocation (``topic``)."""
