"""Networking: the ZeroMQ transport and the threads that digest payloads."""
